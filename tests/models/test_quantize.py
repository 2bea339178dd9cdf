"""The NF4 base (models/quantize.py) on the tiny Qwen2 shape, in-process: what is quantized, what
trains, the reference (adapters off) and the sizes the planner reads (models/quant_methods.py)."""

import math

import pytest
import torch

from logicrl.models.quant_methods import gptq_bits, nf4_bits
from logicrl.models.spec import load_model_spec
from tests.workers.conftest import build_tiny_qwen2

torchao = pytest.importorskip("torchao")

from logicrl.models.quantize import (
    NF4Linear,
    QuantizationError,
    dequantized,
    is_quantized,
    quantize_base,
    scaler_block,
)


def test_bits_per_weight_by_hand():
    # 4-bit codes, one int8 scale per 64 values, one bf16 factor per 64 x 256 values.
    assert nf4_bits(64, 256, 2) == 4 + 8 / 64 + 16 / (64 * 256) == 4.1259765625
    # GPTQ 4-bit, group 128: an fp16 scale and a 4-bit zero per 128 inputs.
    assert gptq_bits(4, 128) == 4 + 20 / 128 == 4.15625


def test_scaler_block_divides_the_block_count():
    assert scaler_block(352 * 128, 64, 256) == 64  # the tiny MLP: 704 blocks, 704 = 11 x 64
    assert scaler_block(64 * 128, 64, 256) == 128  # the tiny k_proj: 128 blocks
    assert scaler_block(18944 * 3584, 64, 256) == 256  # Qwen2.5-7B's MLP: 1,060,864 blocks


def test_the_gptq_shape_carries_its_quantization():
    spec = load_model_spec("logicrl/memory/shapes/qwen2.5-7b-gptq-int4")
    assert (spec.quant_method, spec.quant_bits, spec.quant_group_size) == ("gptq", 4, 128)
    assert load_model_spec("logicrl/memory/shapes/qwen2.5-7b").quant_method is None


def quantized_lora(seed: int = 0):
    from peft import LoraConfig, get_peft_model

    model = build_tiny_qwen2(seed).float()
    ids = torch.arange(3, 40)[None]
    with torch.no_grad():
        full = model(input_ids=ids).logits
    assert quantize_base(model, "nf4", 64, 256) == 2 * 7  # every decoder Linear of both layers
    with torch.no_grad():
        base = model(input_ids=ids).logits
    model = get_peft_model(model, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                             lora_dropout=0.0, task_type="CAUSAL_LM"))
    return model, ids, full, base


def test_only_the_adapters_train_over_a_4bit_base():
    model, _, full, base = quantized_lora()
    names = {n for n, p in model.named_parameters() if p.requires_grad}
    assert names and all(".lora_A." in n or ".lora_B." in n for n in names)
    quantized = [n for n, p in model.named_parameters() if is_quantized(p)]
    assert len(quantized) == 14 and all(n.endswith(("_proj.weight", "base_layer.weight")) for n in quantized)
    assert all(isinstance(m, NF4Linear) for n, m in model.named_modules() if n.endswith("base_layer"))
    assert not any(is_quantized(p) for n, p in model.named_parameters() if "embed" in n or "norm" in n)
    # The 4-bit base is not the fp32 one (rounded), but close: each weight moved by at most half the widest
    # gap of the 16 NF4 codes (1 - 0.723 = 0.277) times its block's absmax s, plus the error of s itself,
    # int8-quantized around its group's mean: one step, 2 max|s - mean| / 256 <= max s / 64.
    assert not torch.equal(base, full)
    layer = build_tiny_qwen2(0).float().model.layers[0].mlp.down_proj.weight.detach()
    q = model.base_model.model.model.layers[0].mlp.down_proj.weight
    err = (dequantized(q) - layer).abs().view(-1, 64)
    s = layer.abs().view(-1, 64).amax(1, keepdim=True)
    assert (err <= 0.277 / 2 * s + s.max() / 64).all()


def test_adapters_train_and_the_reference_is_the_base_without_them():
    model, ids, _, base = quantized_lora()
    frozen = {n: dequantized(p).clone() for n, p in model.named_parameters() if is_quantized(p)}
    opt = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(2):
        model(input_ids=ids, labels=ids).loss.backward()
        opt.step()
        opt.zero_grad()
    with torch.no_grad():
        adapted = model(input_ids=ids).logits
        with model.disable_adapter():
            reference = model(input_ids=ids).logits
    assert not torch.equal(adapted, base)
    torch.testing.assert_close(reference, base, rtol=0, atol=0)  # no second copy: the same base, bit for bit
    for n, p in model.named_parameters():
        if n in frozen:
            assert torch.equal(dequantized(p), frozen[n]), n


def test_a_weight_the_block_does_not_divide_is_refused():
    model = build_tiny_qwen2(0)
    with pytest.raises(QuantizationError, match="quantization_block_size"):
        quantize_base(model, "nf4", 96, 256)  # 128 x 128 = 16,384 is not a multiple of 96
    assert math.gcd(16384, 96) == 32


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_the_dequantize_transient_is_what_the_plan_counts(dtype):
    """memory/footprint.py dequant_bytes, (8 + 3 x dtype) bytes a weight, against the live tensor bytes of
    torchao's dequantize (memory/tracker.py) of Qwen2.5-0.5B's MLP weight (4864 x 896): within 1%."""
    from logicrl.memory.footprint import dequant_bytes
    from logicrl.memory.tracker import PeakTracker
    from logicrl.models.quantize import _import_nf4
    from logicrl.models.spec import ModelSpec

    spec = ModelSpec.from_dict({"hidden_size": 896, "num_attention_heads": 14, "num_key_value_heads": 2,
                                "head_dim": 64, "num_hidden_layers": 1, "intermediate_size": 4864,
                                "vocab_size": 1024}, "0.5b-mlp")
    _, _, to_nf4 = _import_nf4()
    nf4 = to_nf4(torch.randn(4864, 896, dtype=dtype), 64, 256)
    with PeakTracker("cpu") as tracker:
        nf4.get_original_weight()
    planned = dequant_bytes(spec, dtype.itemsize)
    assert planned == (8 + 3 * dtype.itemsize) * 4864 * 896
    assert tracker.peak_bytes - tracker.start_bytes == pytest.approx(planned, rel=0.01)
