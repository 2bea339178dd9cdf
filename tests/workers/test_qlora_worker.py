"""QLoRA on one worker (in-process, the hf engine): an NF4 base under LoRA adapters trains, the engine
samples from the 4-bit policy from the first step (the adapter sync, the default: the dequantized base
once at build, then adapters alone), a checkpoint resumes bit for bit, and the exported adapter loads
with peft onto the same NF4 base and gives the trainer's logits. vLLM's adapter sync over the NF4 base:
tests/workers/test_rollout_vllm_lora.py."""

import pytest
import torch

from logicrl.config.phases import ARR
from logicrl.workers.fsdp import reshard
from logicrl.workers.hf_export import LORA_ADAPTER_DIR
from tests.helpers.worker import ADAPTER_BYTES, BASE_BYTES, add, make_worker, step, trained

pytestmark = pytest.mark.integration
pytest.importorskip("torchao")
QLORA = (f"{ARR}.model.quantization=nf4", f"{ARR}.model.lora_rank=4", f"{ARR}.model.lora_alpha=8",
         f"{ARR}.model.target_modules=[q_proj,v_proj,down_proj]")


def test_qlora_trains_resumes_exactly_and_exports_a_peft_adapter(tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    from logicrl.models.loading import checkpoint_dir
    from logicrl.models.quantize import is_quantized, quantize_base

    worker, prompts = make_worker("hf", *QLORA)
    model = worker.actor.model
    assert sum(is_quantized(p) for p in model.parameters()) == 14
    # The 4-bit base is replicated (left out of FSDP2); the adapters are FSDP2 shards (DTensors).
    assert not any(hasattr(p, "to_local") for p in model.parameters() if is_quantized(p))
    assert all(hasattr(p, "to_local") for p in model.parameters() if p.requires_grad)
    # The engine loaded the fp32 checkpoint and was sent its 4-bit round trip once, before it sampled:
    # every base tensor (BASE_BYTES), and the adapters.
    assert worker.first_sync["perf/update_weights/base_bytes"] == BASE_BYTES
    assert worker.first_sync["perf/update_weights/bytes"] == BASE_BYTES + ADAPTER_BYTES
    batch, metrics = step(worker, prompts, seed=3)
    assert metrics["rollout/logprob_diff"] < 1e-4
    # Each step's sync: the adapters alone, the base never again.
    assert metrics["perf/update_weights/bytes"] == ADAPTER_BYTES and "perf/update_weights/base_bytes" not in metrics
    worker.save_checkpoint(str(tmp_path / "ckpt"), save_hf=True, merge_lora=False)
    saved = trained(worker)
    ids = batch["input_ids"][:2]
    with torch.no_grad():
        logits = model(input_ids=ids).logits
    reshard(model)  # a forward without a backward leaves the root gathered (workers/fsdp.py)

    batch2, metrics = step(worker, prompts, seed=4)  # the reference continuation
    assert metrics["rollout/logprob_diff"] < 1e-4  # the synced adapters reached the engine
    assert metrics["perf/update_weights/bytes"] == ADAPTER_BYTES
    expected = trained(worker)

    again, _ = make_worker("hf", *QLORA)
    again.resume_from(str(tmp_path / "ckpt"))
    for name, value in trained(again).items():
        assert torch.equal(value, saved[name]), name
    batch2.pop("old_log_probs")  # recomputed by the resumed worker
    add(again, batch2, "old_log_prob")
    again.run(batch2, "update_actor")
    for name, value in trained(again).items():
        assert torch.equal(value, expected[name]), name  # bit for bit

    # peft loads the exported adapter onto the checkpoint quantized the same way: the trainer's logits.
    base = AutoModelForCausalLM.from_pretrained(checkpoint_dir("embedded:tiny"), dtype=torch.float32)
    quantize_base(base, "nf4", 64, 256)
    adapted = PeftModel.from_pretrained(base, tmp_path / "ckpt" / "huggingface" / LORA_ADAPTER_DIR).eval()
    with torch.no_grad():
        torch.testing.assert_close(adapted(input_ids=ids).logits, logits, atol=1e-5, rtol=1e-5)
