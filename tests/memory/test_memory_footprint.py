"""Bytes of parameters, shards, AdamW states and saved activations, against hand counts and autograd."""

import pytest

from logicrl.memory.footprint import (
    ModelBytes,
    kv_bytes_per_token,
    logprob_chunk_bytes,
    saved_per_token_layer,
    saved_per_token_root,
    shard,
)
from logicrl.models.spec import ModelSpec
from logicrl.models.tiny import TINY_CONFIG

TINY = ModelSpec.from_dict(TINY_CONFIG, "tiny")  # H 128, 2 layers, 2 heads / 1 KV x 64, I 352, V 2048, tied


def test_shard_pads_dim0_to_the_largest_chunk():
    assert shard((2049, 128), 2) == 1025 * 128
    assert shard((128,), 4) == 32
    assert shard((3,), 4) == 1  # ranks past the end hold padding


def test_tiny_parameters_and_adam_states_on_two_ranks_fp32():
    # One layer: q [128,128] k [64,128] v [64,128] o [128,128] + q/k/v biases 128+64+64 (Qwen2),
    # gate/up [352,128], down [128,352], two norms [128]: 184,832 elements, 92,416 per rank on 2.
    # Root: tied embedding [2048,128] + final norm [128]: 262,272 elements, 131,136 per rank.
    m = ModelBytes.build(TINY, dtype_bytes=4, world=2)
    assert m.total_full == 4 * (2 * 184_832 + 262_272) == 4 * TINY.num_params()
    assert m.total_shard == 4 * (2 * 92_416 + 131_136) == 1_263_872
    assert 2 * m.trainable_shard == 2_527_744  # AdamW's exp_avg + exp_avg_sq on one rank, fp32
    assert m.layer_full == 4 * 184_832 and m.root_full == 4 * 262_272
    assert m.largest_full == 4 * 2048 * 128


def test_fp32_masters_under_bf16_compute_on_two_ranks():
    # The same counts as above (184,832 per layer, 262,272 in the root, 92,416 + 131,136 per rank),
    # stored at 4 bytes and gathered at 2: shards, their gradients and AdamW states are what the fp32
    # case holds; a gathered layer or root half of it; gradients reduced and accumulated in fp32.
    m = ModelBytes.build(TINY, dtype_bytes=2, world=2, master_bytes=4)
    assert m.total_shard == 4 * (2 * 92_416 + 131_136) == 1_263_872
    assert 2 * m.trainable_shard == 2_527_744
    assert m.layer_full == 2 * 184_832 and m.root_full == 2 * 262_272 and m.largest_full == 2 * 2048 * 128
    assert m.layer_reduce == 4 * 184_832 and m.root_reduce == 4 * 262_272
    assert m.trainable_full == 4 * TINY.num_params() == 2_527_744  # the unsharded fp32 accumulation
    same = ModelBytes.build(TINY, dtype_bytes=2, world=2)  # the reference: stored as it computes
    assert same.total_shard == 2 * (2 * 92_416 + 131_136) and same.layer_reduce == same.layer_full


def test_lora_trains_only_fp32_adapters():
    # all-linear, r=8, per layer: A [8, in] + B [out, 8] for q,k,v,o,gate,up,down:
    # 8*(128+128) + 8*(128+64) + 8*(128+64) + 8*(128+128) + 2*8*(128+352) + 8*(352+128) = 18,688.
    m = ModelBytes.build(TINY, dtype_bytes=2, world=1, lora_rank=8,
                         lora_targets_=("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"))
    assert m.trainable_full == 4 * 2 * 18_688  # fp32 masters (peft upcasts bf16 adapters), both layers
    assert m.total_full == 2 * TINY.num_params() + 2 * 2 * 18_688  # gathered: adapters in bf16 too
    assert not m.trainable_root and not m.trainable_lm_head


def test_critic_has_a_value_head_instead_of_the_lm_head():
    untied = ModelSpec.from_dict({**TINY_CONFIG, "tie_word_embeddings": False}, "untied")
    lm = ModelBytes.build(untied, dtype_bytes=4, world=1)
    value = ModelBytes.build(untied, dtype_bytes=4, world=1, head="value")
    assert lm.total_full - value.total_full == 4 * (2048 * 128 - 128 - 1)


def test_activation_bytes_hand_counted():
    # fp32, width 100: norms 2*(4*128 + 4 + 4*128) = 2056; norm outputs and the MLP product
    # 4*(2*128 + 352) = 2432; attention 4*4*128 + 4*2 heads + 4*100 (mask) = 2456; MLP 3*4*352 = 4224.
    assert saved_per_token_layer(TINY, 4, 100) == 2056 + 2432 + 2456 + 4224
    # root: final norm's input and h, rsqrt, cos + sin, ids
    assert saved_per_token_root(TINY, 4) == 4 * 128 + 4 + 4 * 128 + 2 * 4 * 64 + 8
    assert kv_bytes_per_token(TINY, 2) == 2 * 2 * 1 * 64 * 2
    assert logprob_chunk_bytes(2048, 1024, 4) == 2 * 4 * 1024 * 2048
    assert logprob_chunk_bytes(2048, 1024, 2) == (2 * 4 + 2) * 1024 * 2048


def _saved_bytes(model, batch: int, width: int) -> int:
    """Bytes of the distinct storages autograd saves in one forward, parameters excluded."""
    import torch

    ids = torch.randint(0, 1000, (batch, width))
    mask = torch.ones(batch, width, dtype=torch.long)
    mask[0, :3] = 0  # left padding, as every RL batch has: HF builds a padding mask
    saved = {}

    def pack(t):
        saved[t.untyped_storage().data_ptr()] = t.untyped_storage().nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model.model(input_ids=ids, attention_mask=mask, position_ids=(mask.cumsum(-1) - 1).clamp(min=0))
    params = {p.untyped_storage().data_ptr() for p in model.parameters()}
    return sum(v for k, v in saved.items() if k not in params)


@pytest.mark.parametrize("dtype_name, lora", [("float32", False), ("bfloat16", False), ("bfloat16", True),
                                              ("float32", True)])
def test_saved_activations_match_autograd(dtype_name, lora):
    """The per-layer formula is exact: one layer more adds exactly saved_per_token_layer per token."""
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    dtype, b = getattr(torch, dtype_name), 4 if dtype_name == "float32" else 2
    targets = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
    totals = []
    for layers in (1, 2):
        torch.manual_seed(0)
        config = transformers.Qwen2Config(hidden_size=128, num_hidden_layers=layers, num_attention_heads=4,
                                          num_key_value_heads=2, head_dim=32, intermediate_size=352,
                                          vocab_size=1024, tie_word_embeddings=True)
        model = transformers.AutoModelForCausalLM.from_config(config).to(dtype)
        if lora:
            from peft import LoraConfig, get_peft_model

            model = get_peft_model(model, LoraConfig(r=4, target_modules="all-linear", task_type="CAUSAL_LM"))
            # The fp32 adapters as the actor's FSDP2 policy gathers them: in the model's dtype.
            model = model.base_model.model.to(dtype)
        totals.append(_saved_bytes(model, batch=2, width=48))
    spec = ModelSpec.from_dict({"hidden_size": 128, "num_hidden_layers": 1, "num_attention_heads": 4,
                                "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 352,
                                "vocab_size": 1024, "model_type": "qwen2"}, "probe")
    per_layer = saved_per_token_layer(spec, b, 48, lora=targets if lora else (), lora_rank=4 if lora else 0)
    assert totals[1] - totals[0] == 2 * 48 * per_layer
