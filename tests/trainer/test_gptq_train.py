"""main_ppo.py over a GPTQ int4 checkpoint (the tiny model quantized by gptqmodel on CPU): LoRA adapters
train on the hf engine, a run killed at step 2 resumes from its step-1 checkpoint and ends where the
uninterrupted run ends, bit for bit (tests/workers/test_gptq_worker.py checks the same in process)."""

from pathlib import Path

import pytest
from safetensors.torch import load_file

from logicrl.config.phases import ARR
from tests.conftest import ROLE_DATA, TINY_RUN, read_metrics, run_main, tail
from tests.helpers.gptq import TARGETS, quantize_tiny

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("kk_role")]
pytest.importorskip("gptqmodel")
pytest.importorskip("optimum")

SAME = ("critic/score/mean", "actor/pg_loss", "actor/grad_norm", "actor/kl_loss", "response_length/mean")
ADAPTER = "global_step_2/huggingface/lora_adapter/adapter_model.safetensors"


def lora_on(model: Path) -> list[str]:
    """TINY_RUN with LoRA adapters over the GPTQ checkpoint at `model`, saved every step with the adapter."""
    return [*ROLE_DATA, *TINY_RUN, f"{ARR}.actor.ppo_micro_batch_size_per_gpu=2", f"{ARR}.model.path={model}",
            f"{ARR}.model.lora_rank=4", f"{ARR}.model.lora_alpha=8", f"{ARR}.actor.use_kl_loss=true",
            f"{ARR}.model.target_modules=[{','.join(TARGETS)}]", f"{ARR}.actor.optim.lr=1e-2",
            "trainer.save_freq=1", "trainer.save_hf_model=true"]


def test_a_gptq_lora_run_killed_at_step_2_resumes_bit_exactly(tmp_path):
    model = quantize_tiny(tmp_path / "tiny-gptq")
    whole = run_main(*lora_on(model), ckpt=tmp_path / "ckpt_a", run_dir=tmp_path / "run_a")
    assert whole.returncode == 0, tail(whole)
    reference = read_metrics(tmp_path / "run_a")
    assert [r["step"] for r in reference] == [1, 2]
    assert max(r["rollout/logprob_diff"] for r in reference) < 1e-4  # the engine holds the same int4 base

    killed = run_main(*lora_on(model), ckpt=tmp_path / "ckpt_b", run_dir=tmp_path / "run_b1",
                      fault="sigkill@generate:2")
    assert killed.returncode == -9, tail(killed)
    resumed = run_main(*lora_on(model), ckpt=tmp_path / "ckpt_b", run_dir=tmp_path / "run_b2")
    assert resumed.returncode == 0, tail(resumed)
    ours = read_metrics(tmp_path / "run_b2")
    assert [r["step"] for r in ours] == [2]
    assert {k: ours[0][k] for k in SAME} == {k: reference[1][k] for k in SAME}
    a, b = load_file(tmp_path / "ckpt_a" / ADAPTER), load_file(tmp_path / "ckpt_b" / ADAPTER)
    assert a.keys() == b.keys() and all(k.count("lora_") for k in a)  # the adapters alone: no int4 base saved
    assert all((a[k] == b[k]).all() for k in a)
