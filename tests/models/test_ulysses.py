"""Ulysses sequence parallelism (models/ulysses.py) gives the SP = 1 numbers on the same rows.

Four gloo ranks in one spawn: two SP groups of 2 ([0, 1], [2, 3]) and one of 4. A Qwen2 with 4 query
and 2 KV heads: SP 2 splits the KV heads, SP 4 replicates them. Each rank computes the SP = 1 reference
itself (the same seeded model, no group), then the sharded forward; log-probs, entropies, values, a
reward model's scores and the gradients (the group's mean, which is what FSDP's mean over ranks makes
of them, see models/ulysses.py) must agree at fp32 atol 1e-5. Rows of uneven prompt and response lengths
whose packed length (30 tokens) is not a multiple of 4, so the padded tail is exercised; with and without
LoRA; the LoRA and the value cases also recompute their layers in backward (gradient checkpointing).
"""

import pytest
import torch
import torch.distributed as dist
import transformers

from logicrl.controller.ports import free_port
from logicrl.models.attention import packed_attention
from tests.helpers.spawn import spawn
from tests.models.conftest import trainer_batch
from tests.workers.conftest import leave_group

pytestmark = pytest.mark.integration

PROMPTS, RESPONSES = [3, 5, 2, 4], [6, 1, 7, 2]  # 30 real tokens
ATOL = 1e-5


def _config(**kw):
    return transformers.Qwen2Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                    head_dim=16, intermediate_size=96, vocab_size=256, tie_word_embeddings=True,
                                    attn_implementation=packed_attention(True, torch.device("cpu"), torch.float32),
                                    **kw)


def _causal_lm(lora: bool):
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(_config())
    if lora:
        from peft import LoraConfig, get_peft_model

        # init_lora_weights=False: B is random too, so the adapters change the numbers being compared.
        model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                 init_lora_weights=False))
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model.train()


def _value_model():
    torch.manual_seed(0)
    config = _config(num_labels=1)
    config.classifier_dropout = 0.0  # as models/loading.py load_value_model: no random masks in train mode
    model = transformers.AutoModelForTokenClassification.from_config(config)
    # A fully trained model that recomputes its layers in backward (the LoRA case checkpoints an adapter's).
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model.train()


def _grads(model):
    return {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}


def _compare(what, got, want):
    assert torch.allclose(got, want, atol=ATOL), f"{what}: max |diff| {(got - want).abs().max().item():.3g}"


def _compare_grads(what, grads, want, sp):
    """Each rank's gradients cover its shard of the tokens: summed over the SP group, averaged as FSDP would."""
    for name, g in grads.items():
        dist.all_reduce(g, group=sp.group)
        _compare(f"{what} {name}", g / sp.size, want[name])


def _logprob_case(sp, lora, ids, mask, pos, r):
    from logicrl.models.logprob import causal_lm_logprobs
    from logicrl.models.ulysses import use_ulysses

    rmask = mask[:, -r:].float()
    weights = torch.linspace(0.5, 1.5, rmask.numel()).view_as(rmask) * rmask  # a loss that weighs every token

    def run(model, group):
        lp, ent = causal_lm_logprobs(model, ids, mask, pos, r, chunk_tokens=5, with_entropy=True,
                                     remove_padding=True, sp=group)
        ((lp * weights).sum() + 0.1 * (ent * weights).sum()).backward()
        return lp.detach(), ent.detach(), _grads(model)

    want = run(_causal_lm(lora), None)
    model = _causal_lm(lora)
    use_ulysses(model)
    lp, ent, grads = run(model, sp)
    _compare(f"SP{sp.size} lora={lora} log-probs", lp, want[0])
    _compare(f"SP{sp.size} lora={lora} entropies", ent, want[1])
    _compare_grads(f"SP{sp.size} lora={lora} grad", grads, want[2], sp)


def _value_case(sp, ids, mask, pos, r):
    from tensordict import TensorDict

    from logicrl.models.reward_model import sequence_scores
    from logicrl.models.ulysses import use_ulysses
    from logicrl.workers.critic import response_values

    batch = TensorDict({"input_ids": ids, "attention_mask": mask, "position_ids": pos, "responses": ids[:, -r:]},
                       batch_size=[ids.shape[0]])

    def run(model, group):
        values = response_values(model, batch, remove_padding=True, sp=group)
        (values * mask[:, -r:]).pow(2).sum().backward()
        with torch.no_grad():
            scores = sequence_scores(model, ids, mask, pos, remove_padding=True, sp=group)
        return values.detach(), scores, _grads(model)

    want = run(_value_model(), None)
    model = _value_model()
    use_ulysses(model)
    values, scores, grads = run(model, sp)
    _compare(f"SP{sp.size} values", values, want[0])
    _compare(f"SP{sp.size} reward scores", scores, want[1])
    _compare_grads(f"SP{sp.size} value grad", grads, want[2], sp)


def _rank(rank: int, world: int, port: int):
    import os

    from logicrl.models.ulysses import SequenceParallel

    torch.set_num_threads(1)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("gloo", rank=rank, world_size=world)
    pairs = [dist.new_group([0, 1]), dist.new_group([2, 3])]  # every rank creates every group, in one order
    whole = dist.new_group(list(range(world)))
    r = max(RESPONSES)
    ids, mask, pos = trainer_batch(PROMPTS, RESPONSES, max(PROMPTS), r, vocab=256)
    for sp in (SequenceParallel(pairs[rank // 2], 2, rank % 2), SequenceParallel(whole, 4, rank)):
        for lora in (False, True):
            _logprob_case(sp, lora, ids, mask, pos, r)
        _value_case(sp, ids, mask, pos, r)
    leave_group()


def test_ulysses_equals_sp1_on_2_and_4_ranks():
    spawn(_rank, args=(4, free_port()), nprocs=4)
