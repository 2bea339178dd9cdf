"""weight_sync.iter_adapter_weights: only the LoRA A/B matrices, in the asked dtype, their bytes counted,
none sharing a trained parameter's storage (vLLM scales lora_B in place). A hand-built peft model: one
Linear 6 -> 4 adapted at rank 2 has A [2, 6] and B [4, 2], 20 numbers."""

import torch
from peft import LoraConfig, get_peft_model

from logicrl.workers.weight_sync import iter_adapter_weights, iter_engine_weights


class Two(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.proj = torch.nn.Linear(6, 4)
        self.other = torch.nn.Linear(4, 3)

    def forward(self, x):
        return self.other(self.proj(x))


def model():
    torch.manual_seed(0)
    m = get_peft_model(Two(), LoraConfig(r=2, lora_alpha=4, target_modules=["proj"]))
    with torch.no_grad():
        m.base_model.model.proj.lora_B.default.weight.normal_()  # peft starts B at 0: doubling it would show nothing
    return m


def test_only_the_adapters_their_bytes_and_their_own_storage():
    m = model()
    stats: dict = {}
    got = dict(iter_adapter_weights(m, None, stats))
    assert sorted(got) == ["base_model.model.proj.lora_A.default.weight", "base_model.model.proj.lora_B.default.weight"]
    assert stats == {"bytes": (2 * 6 + 4 * 2) * 4, "tensors": 2}  # fp32
    params = dict(m.named_parameters())
    for name, tensor in got.items():
        assert torch.equal(tensor, params[name])
        tensor.mul_(2)  # what vLLM does to B: the trainer's parameter must not change
        assert not torch.equal(tensor, params[name])
    half = dict(iter_adapter_weights(m, torch.bfloat16, stats))
    assert stats["bytes"] == (2 * 6 + 4 * 2) * 2 and all(t.dtype == torch.bfloat16 for t in half.values())


def test_the_merged_stream_counts_every_weight_it_sends():
    stats: dict = {}
    names = [n for n, _ in iter_engine_weights(model(), None, stats)]
    # proj (weight 4x6 + bias 4, the adapter folded in) and other (3x4 + 3): 43 numbers, fp32.
    assert names == ["proj.weight", "proj.bias", "other.weight", "other.bias"]
    assert stats["bytes"] == (24 + 4 + 12 + 3) * 4


def test_the_base_stream_leaves_the_adapters_out():
    # merge_lora=False: what an engine over a 4-bit base is sent once (docs/quantization.md), the base alone.
    m, stats = model(), {}
    got = dict(iter_engine_weights(m, None, stats, merge_lora=False))
    layer = m.base_model.model.proj
    assert torch.equal(got["proj.weight"], layer.base_layer.weight)  # B @ A (B drawn non-zero) not folded in
    assert not torch.equal(dict(iter_engine_weights(m))["proj.weight"], layer.base_layer.weight)
    assert list(got) == ["proj.weight", "proj.bias", "other.weight", "other.bias"]
    assert stats["bytes"] == (24 + 4 + 12 + 3) * 4
