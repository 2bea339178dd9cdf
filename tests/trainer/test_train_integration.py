"""The real entry point, trained for a step or two on the embedded tiny model, on CPU ranks."""

import json
import re
from pathlib import Path

import pytest

from logicrl.config.phases import ARR
from logicrl.config.plan import PHASES
from tests.conftest import ROLE_DATA, TINY_RUN, run_main, tail, write_jsonl

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("kk_role")]
# The trainer with HF's engine (TINY_RUN); the vLLM tests below, LoRA's weight sync and
# tests/trainer/test_console.py run vLLM.
SMALL = [*TINY_RUN, f"{ARR}.actor.ppo_micro_batch_size_per_gpu=2"]


def train(tmp_path: Path, *overrides: str) -> list[dict]:
    run_dir = tmp_path / "run"
    result = run_main(*ROLE_DATA, *SMALL, *overrides, f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert result.returncode == 0, tail(result)
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_dry_run_plans_the_steps_and_phases_the_trainer_runs(tmp_path):
    """Also PPO with a critic, two mini-batches and gradient checkpointing (one run for both)."""
    # 20 usable rows in batches of 4: 5 steps per epoch, and total_training_steps=50 cannot add epochs.
    data = write_jsonl(tmp_path / "d" / "train.jsonl", 20)
    args = [f"data.train_files={data}", f"data.val_files={data}", *SMALL, "trainer.total_training_steps=50",
            "algorithm.adv_estimator=gae", f"{ARR}.actor.use_kl_loss=true", f"{ARR}.actor.ppo_epochs=2",
            f"{ARR}.actor.ppo_mini_batch_size=2", "critic.ppo_micro_batch_size_per_gpu=2",
            f"{ARR}.model.enable_gradient_checkpointing=true"]
    dry = run_main(*args, "trainer.dry_run=true", cwd=tmp_path)
    assert dry.returncode == 0, tail(dry)
    assert "5 steps per epoch, 5 steps in all" in dry.stdout
    table = dry.stdout[dry.stdout.index("memory plan per device"):]
    # Below the attention line and the column header.
    planned = {line.split()[0] for line in table.splitlines()[3:] if line and not line.startswith("note")}

    run_dir = tmp_path / "run"
    result = run_main(*args, f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert result.returncode == 0, tail(result)
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    measured = {m.group(1) for key in rows[-1] if (m := re.fullmatch(r"perf/memory/(\w+)/peak_gb", key))}
    # Every phase that reported its memory is a row of the dry run's table, under the same name.
    assert measured == {"generate", "old_log_prob", "ref", "values", "update_critic", "update_actor",
                        "update_weights"} <= planned
    # The step's timings use the same names: the plan's phases, the step and the checkpoint save.
    timed = {key.split("/", 1)[1] for key in rows[-1] if key.startswith("timing_s/")}
    assert timed - {"step", "save"} <= set(PHASES) and {"generate", "reward", "advantages"} <= timed
    # The engine's log-probs of its samples equal the trainer's before the update (weights in sync).
    assert rows[-1]["rollout/logprob_diff"] < 1e-3
    # PPO with a critic, two mini-batches and gradient checkpointing.
    last = rows[-1]
    for key in ("critic/vf_loss", "timing_s/values", "timing_s/update_critic", "timing_s/old_log_prob"):
        assert key in last, key


def test_multirun_two_jobs(tmp_path):
    sweep, ckpt = tmp_path / "sweep", tmp_path / "ckpt"
    args = ["-m", *ROLE_DATA, *SMALL, "trainer.total_training_steps=1", f"{ARR}.rollout.n=2,4",
            f"hydra.sweep.dir={sweep}", f"trainer.default_local_dir={ckpt}"]
    result = run_main(*args, cwd=tmp_path)
    assert result.returncode == 0, tail(result)
    jobs = ["rollout.n=2", "rollout.n=4"]  # named by the swept value, run and checkpoint directories alike
    for job in jobs:
        assert (sweep / job / "metrics.jsonl").read_text().strip()
    # Each job checkpoints in its own directory: the second must not resume from the first.
    assert sorted(p.name for p in ckpt.iterdir()) == jobs
    assert all((ckpt / job / "global_step_1" / "COMPLETE").is_file() for job in jobs)
    summary = (sweep / "sweep_summary.md").read_text()
    for job in jobs:  # steps, reward, step time and measured peaks per phase
        row = next(line for line in summary.splitlines() if line.startswith(f"| {job} |"))
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert cells[1] == "done" and cells[2] == "1" and float(cells[3]) >= 0 and float(cells[6]) > 0, row
        assert float(cells[summary.splitlines()[4].strip("|").split("|").index(" update_actor GB ")]) > 0, row
    # The same sweep again: each job finds its own finished checkpoint and trains nothing.
    again = run_main(*args[:-2], f"hydra.sweep.dir={tmp_path / 'again'}", f"trainer.default_local_dir={ckpt}",
                     cwd=tmp_path)
    assert again.returncode == 0, tail(again)
    for job in jobs:
        assert f"{ckpt / job} already holds step 1 of 1" in again.stdout


# On one rank, LoRA with a KL loss: the reference is the actor without its adapters, and vLLM's weight
# sync merges the adapters into the engine's base weights. Also REINFORCE++ over two epochs, so the
# old-log-prob pass runs, with validation at step 2 (vLLM's sampling of the 200 validation prompts).
# Two ranks on the vLLM engine: tests/trainer/test_console.py; a separate reference model: the dry-run
# test above.
LORA = [f"{ARR}.model.lora_rank=4", f"{ARR}.model.lora_alpha=8", f"{ARR}.actor.use_kl_loss=true",
        f"{ARR}.model.target_modules=[q_proj,v_proj]", "algorithm.adv_estimator=reinforce_plus_plus",
        f"{ARR}.actor.ppo_epochs=2", "trainer.test_freq=2"]


@pytest.mark.parametrize("ranks, tp, extra", [(1, 1, LORA), (2, 2, [])], ids=["1-lora", "2-tp2"])
def test_grpo_with_the_vllm_engine(tmp_path, ranks, tp, extra):
    pytest.importorskip("vllm")
    rows = train(tmp_path, f"{ARR}.rollout.name=vllm", f"trainer.n_gpus={ranks}",
                 f"{ARR}.rollout.tensor_model_parallel_size={tp}", *extra)
    assert [r["step"] for r in rows] == [1, 2]
    assert "timing_s/update_weights" in rows[-1] and rows[-1]["response_length/mean"] > 0
    # Step 2 samples from the weights step 1 synced (into both TP members with tp=2): the engine's
    # log-probs still match the trainer's (fp32 on CPU).
    assert rows[-1]["rollout/logprob_diff_max"] < 1e-3
    if extra == LORA:
        # The adapterless reference runs and the KL loss is reported; two optimizer steps per step: the
        # old-log-prob pass must run, and the second epoch sees a moved policy.
        assert "actor/kl_loss" in rows[-1] and "timing_s/ref" in rows[-1] and "timing_s/old_log_prob" in rows[-1]
        assert rows[-1]["actor/ppo_kl"] != 0.0
        # Validation at step 2 writes accuracy, per data source too, and its samples.
        assert "val/acc" in rows[-1] and "val/kk_role/acc" in rows[-1]
        assert (tmp_path / "run" / "val_generations" / "step_2.jsonl").is_file()
