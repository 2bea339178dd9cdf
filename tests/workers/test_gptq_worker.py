"""A pre-quantized GPTQ int4 checkpoint under LoRA (models/gptq.py), in process on the hf engine.

The fixture quantizes the tiny model with gptqmodel's CPU path (4 bits, groups of 32: the tiny MLP's 352
inputs split into 11), as a user's Qwen2.5-7B-GPTQ-Int4 was made. The loader keeps the int4 codes as
frozen buffers and trains only the adapters; the worker trains, samples from the same int4 base in the
engine (adapters synced alone), resumes bit for bit, and exports a peft adapter that loads onto the
checkpoint with the trainer's logits."""


import pytest
import torch

from logicrl.config.phases import ARR
from logicrl.workers.fsdp import reshard
from logicrl.workers.hf_export import LORA_ADAPTER_DIR
from tests.helpers.gptq import GROUP, TARGETS, quantize_tiny
from tests.helpers.worker import add, make_worker, step, trained

pytestmark = pytest.mark.integration
pytest.importorskip("gptqmodel")
pytest.importorskip("optimum")
@pytest.fixture(scope="module")
def gptq_tiny(tmp_path_factory):
    return quantize_tiny(tmp_path_factory.mktemp("gptq") / "tiny-gptq")


def unpacked(module) -> torch.Tensor:
    """The module's weight, transposed (in, out) as gptqmodel's dequantize returns it, by hand from the GPTQ
    layout: eight 4-bit codes per int32, packed along the inputs in qweight and along the outputs in qzeros;
    weight = scale * (code - zero), one scale and zero per group of GROUP inputs and output column (gptqmodel
    keeps the zeros as stored, the v2 layout; the v1 files add 1 when they are read)."""
    shifts = torch.arange(0, 32, 4, dtype=torch.int32)
    codes = ((module.qweight.unsqueeze(1) >> shifts.view(1, 8, 1)) & 15).reshape(-1, module.qweight.shape[1])
    zeros = ((module.qzeros.unsqueeze(2) >> shifts.view(1, 1, 8)) & 15).reshape(module.qzeros.shape[0], -1)
    group = torch.arange(codes.shape[0]) // GROUP
    return module.scales[group].float() * (codes - zeros[group]).float()


def test_the_gptq_base_loads_frozen_int4_and_only_the_adapters_train(gptq_tiny):
    from transformers import AutoModelForCausalLM

    from logicrl.models.gptq import is_gptq_linear
    from logicrl.models.loading import LoraSpec, checkpoint_dir, load_causal_lm

    model = load_causal_lm(str(gptq_tiny), torch.float32, lora=LoraSpec(4, 8, TARGETS))
    linears = {n: m for n, m in model.named_modules() if is_gptq_linear(m)}
    assert len(linears) == 14  # 7 Linears x 2 layers, all int4
    assert all(b.dtype == torch.int32 for m in linears.values() for b in (m.qweight, m.qzeros))
    assert {n for n, p in model.named_parameters() if p.requires_grad} == {
        n for n, _ in model.named_parameters() if "lora_" in n}  # nothing of the base trains
    # The int4 weight is the stored codes, scaled: by hand, to fp16's rounding of the scale product.
    down = linears["base_model.model.model.layers.0.mlp.down_proj.base_layer"]
    torch.testing.assert_close(down.dequantize_weight().float(), unpacked(down), atol=2e-3, rtol=2e-3)
    # ... and near the fp32 checkpoint's weight it was quantized from: within a few quantization steps.
    source = AutoModelForCausalLM.from_pretrained(checkpoint_dir("embedded:tiny"), dtype=torch.float32)
    original = source.model.layers[0].mlp.down_proj.weight.T
    step_size = down.scales.float().repeat_interleave(GROUP, 0)  # (in, out): the scale of each weight's group
    assert ((down.dequantize_weight().float() - original).abs() / step_size).mean() < 1

    ids = torch.randint(0, 700, (2, 12), generator=torch.Generator().manual_seed(0))
    buffers = {n: b.clone() for n, b in model.named_buffers()}
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-2)
    for _ in range(2):  # lora_B starts at zero: the second step moves lora_A too
        model(input_ids=ids, labels=ids).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    assert all(torch.equal(b, buffers[n]) for n, b in model.named_buffers())  # the int4 base never moves
    with torch.no_grad():
        adapted = model(input_ids=ids).logits
        with model.disable_adapter():  # the reference: the same base, adapters off
            reference = model(input_ids=ids).logits
        base = load_causal_lm(str(gptq_tiny), torch.float32)(input_ids=ids).logits  # no peft
    torch.testing.assert_close(reference, base, atol=1e-5, rtol=1e-5)
    assert (adapted - reference).abs().max() > 1e-3  # the trained adapters change the policy


def test_gptq_lora_trains_resumes_exactly_and_exports_a_peft_adapter(gptq_tiny, tmp_path):
    from peft import PeftModel

    from logicrl.models.loading import load_causal_lm

    lora = (f"{ARR}.model.path={gptq_tiny}", f"{ARR}.model.lora_rank=4", f"{ARR}.model.lora_alpha=8",
            f"{ARR}.model.target_modules=[{','.join(TARGETS)}]")
    worker, prompts = make_worker("hf", *lora)
    model = worker.actor.model
    assert all(hasattr(p, "to_local") for p in model.parameters() if p.requires_grad)  # FSDP2 shards the adapters
    assert not any(hasattr(b, "to_local") for n, b in model.named_buffers() if "qweight" in n)  # the base is whole
    batch, metrics = step(worker, prompts, seed=3)
    assert metrics["rollout/logprob_diff"] < 1e-4  # the engine holds the same int4 base
    worker.save_checkpoint(str(tmp_path / "ckpt"), save_hf=True, merge_lora=False)
    saved = trained(worker)
    ids = batch["input_ids"][:2]
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    reshard(model)

    batch2, metrics = step(worker, prompts, seed=4)
    assert metrics["rollout/logprob_diff"] < 1e-4  # the synced adapters reached the engine
    expected = trained(worker)

    again, _ = make_worker("hf", *lora)
    again.resume_from(str(tmp_path / "ckpt"))
    for name, value in trained(again).items():
        assert torch.equal(value, saved[name]), name
    batch2.pop("old_log_probs")
    add(again, batch2, "old_log_prob")
    again.run(batch2, "update_actor")
    for name, value in trained(again).items():
        assert torch.equal(value, expected[name]), name  # bit for bit

    # peft loads the exported adapter onto the checkpoint loaded with the same kernel: the trainer's logits.
    # (transformers' default kernel on CPU, an AVX512 one, differs from it by up to 0.04 in a logit.)
    base = load_causal_lm(str(gptq_tiny), torch.float32)
    adapted = PeftModel.from_pretrained(base, tmp_path / "ckpt" / "huggingface" / LORA_ADAPTER_DIR).eval()
    with torch.no_grad():
        torch.testing.assert_close(adapted(input_ids=ids).logits, logits, atol=1e-5, rtol=1e-5)
