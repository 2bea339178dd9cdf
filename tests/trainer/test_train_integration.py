"""The real entry point, trained for a step or two on the embedded tiny model, on CPU ranks."""

import json
import re
from pathlib import Path

import pytest

from logicrl.algo_names import POLICY_LOSS_MODES
from logicrl.config.phases import ARR
from logicrl.config.plan import PHASES
from logicrl.launch.sweep_summary import job_rows, plot
from tests.conftest import (
    MEMORY_BAND,
    ROLE_DATA,
    TINY_RUN,
    check_main,
    peak_over_plan,
    read_metrics,
    run_main,
    tail,
    write_jsonl,
)

pytestmark = [pytest.mark.integration, pytest.mark.usefixtures("kk_role")]
# The trainer with HF's engine (TINY_RUN); the vLLM tests below, LoRA's weight sync and
# tests/trainer/test_console.py run vLLM.
SMALL = [*TINY_RUN, f"{ARR}.actor.ppo_micro_batch_size_per_gpu=2"]
# The built-in losses, taken at collection: a test that loads a user's loss module adds its name to the list.
BUILT_IN_LOSSES = tuple(POLICY_LOSS_MODES)


def train(tmp_path: Path, *overrides: str) -> list[dict]:
    run_dir = tmp_path / "run"
    result = run_main(*ROLE_DATA, *SMALL, *overrides, f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert result.returncode == 0, tail(result)
    return read_metrics(run_dir)


def test_dry_run_plans_the_steps_and_phases_the_trainer_runs(tmp_path):
    """Also PPO with a critic, two mini-batches and gradient checkpointing (one run for both), with the
    default token TIS, token and geometric rejection, and CISPO's loss (rollout correction, decoupled)."""
    # 20 usable rows in batches of 4: 5 steps per epoch, and total_training_steps=50 cannot add epochs.
    data = write_jsonl(tmp_path / "d" / "train.jsonl", 20)
    args = [f"data.train_files={data}", f"data.val_files={data}", *SMALL, "trainer.total_training_steps=50",
            "algorithm.adv_estimator=gae", f"{ARR}.actor.use_kl_loss=true", f"{ARR}.actor.ppo_epochs=2",
            f"{ARR}.actor.ppo_mini_batch_size=2", "critic.ppo_micro_batch_size_per_gpu=2",
            f"{ARR}.model.enable_gradient_checkpointing=true", f"{CORR}.rollout_rs='token,geometric'",
            f"{CORR}.rollout_rs_threshold='0.5_2.0,0.9_1.1'", f"{ARR}.actor.policy_loss.loss_mode=cispo",
            "trainer.track_tensor_peaks=true"]  # the measured peaks against the plan (TINY_RUN leaves them out)
    dry = check_main(*args, "trainer.dry_run=true", cwd=tmp_path)  # main_ppo.py's dry run, in-process
    assert dry.code == 0, dry.line
    assert "5 steps per epoch, 5 steps in all" in dry.out
    table = dry.out[dry.out.index("memory plan per device"):]
    # Below the attention line and the column header.
    planned = {line.split()[0] for line in table.splitlines()[3:] if line and not line.startswith("note")}

    run_dir = tmp_path / "run"
    result = run_main(*args, f"hydra.run.dir={run_dir}", cwd=tmp_path)
    assert result.returncode == 0, tail(result)
    rows = read_metrics(run_dir)
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    measured = {m.group(1) for key in rows[-1] if (m := re.fullmatch(r"perf/memory/(\w+)/rss_peak_gb", key))}
    # The first step also tracks each phase's live tensors (memory/telemetry.py tracks_tensors), the
    # quantity the plan predicts: below the process's RSS, which holds Python and the libraries as well.
    tracked = {m.group(1) for key in rows[0] if (m := re.fullmatch(r"perf/memory/(\w+)/tensor_peak_gb", key))}
    assert tracked == measured and not any(key.endswith("/tensor_peak_gb") for key in rows[-1])  # step 5: not tracked
    first = rows[0]
    assert all(0 < first[f"perf/memory/{p}/tensor_peak_gb"] < first[f"perf/memory/{p}/rss_peak_gb"] for p in tracked)
    # The closing table: each phase's plan beside its tensor peak, as measured in this run, within the band of
    # the plan for what step 1 ran (hf's engine, a critic, a reference, two mini-batches, checkpointing).
    ratios = peak_over_plan(result.stdout)
    assert set(ratios) == tracked, ratios
    assert all(MEMORY_BAND[0] <= r <= MEMORY_BAND[1] for r in ratios.values()), ratios
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
    # On CPU the engine and the trainer agree (~1e-6): the weights are 1 and nothing is truncated or rejected.
    assert abs(last["rollout_corr/kl"]) < 1e-3 and last["rollout_corr/rollout_is_mean"] == pytest.approx(1, abs=1e-3)
    assert last["rollout_corr/rollout_is_ratio_fraction_high"] == 0
    assert last["rollout_corr/rollout_rs_masked_fraction"] == 0


def test_multirun_two_jobs(tmp_path):
    sweep, ckpt = tmp_path / "sweep", tmp_path / "ckpt"
    args = ["-m", *ROLE_DATA, *SMALL, "trainer.total_training_steps=1", "trainer.track_tensor_peaks=true",
            "trainer.plot_curves=true", f"{ARR}.rollout.n=2,4", f"hydra.sweep.dir={sweep}",
            f"trainer.default_local_dir={ckpt}"]
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
        assert f"[curves.png]({job}/curves.png)" in row and (sweep / job / "curves.png").is_file()
    # The picture: both jobs' curves (one step each) against step and wall time, read back from the
    # figure, beside the memory bars with the capacity the jobs planned for.
    drawn = plot(job_rows(sweep), tmp_path / "redrawn.png")
    rewards = json.loads((sweep / jobs[0] / "metrics.jsonl").read_text().splitlines()[-1])
    assert drawn["reward vs step"][jobs[0]] == [(1, rewards["critic/score/mean"])]
    assert drawn["reward vs wall time"][jobs[0]] == [(round(rewards["timing_s/step"], 3), rewards["critic/score/mean"])]
    assert set(drawn["reward vs step"]) == set(drawn["accuracy (validation dashed) vs wall time"]) == set(jobs)
    # Each job planned for the RAM available when it started: the line marks the smallest.
    capacity = min(json.loads((sweep / job / "result.json").read_text())["capacity_gb"] for job in jobs)
    # Dashed where it fits the bars' scale (GB or MB), else said in the panel's title.
    memory = next(title for title in drawn if title.startswith("peak memory per phase"))
    label = f"capacity {capacity:.1f} GB (cpu)"
    assert f"{label} is off this scale" in memory or \
        [y for _, y in drawn[memory][label]] in ([capacity] * 2, [capacity * 1024.0] * 2), memory
    # The same sweep again: each job finds its own finished checkpoint and trains nothing.
    again = run_main(*args[:-2], f"hydra.sweep.dir={tmp_path / 'again'}", f"trainer.default_local_dir={ckpt}",
                     cwd=tmp_path)
    assert again.returncode == 0, tail(again)
    for job in jobs:
        assert f"{ckpt / job} already holds step 1 of 1" in again.stdout


# On one rank, QLoRA (LoRA over an NF4 base) with a KL loss: the reference is the actor without its
# adapters, and vLLM's weight sync sends the adapters alone (rollout.lora_sync=adapters), the dequantized
# base having gone once at build (the merged sync is checked in tests/workers/test_hybrid_worker.py;
# QLoRA's resume and export: tests/workers/test_qlora_worker.py, learning: test_learning.py). Also REINFORCE++ over two
# epochs, so the old-log-prob pass runs, with validation at step 2 (vLLM's sampling of the 200 validation
# prompts).
# Two ranks on the vLLM engine: 2-tp2-bypass-dynamic below; the default as make train runs it, learning:
# test_console.py; a separate reference model: the dry-run
# test above.
CORR = "algorithm.rollout_correction"
# Two ranks: rollout correction's bypass mode (the engine's log-probs are the old ones, no old-log-prob
# pass) with verl's REINFORCE loss and self-normalised sequence weights.
BYPASS = [f"{CORR}.bypass_mode=true", f"{CORR}.loss_type=reinforce", f"{CORR}.rollout_is=sequence",
          f"{CORR}.rollout_is_batch_normalize=true"]
LORA = [f"{ARR}.model.lora_rank=4", f"{ARR}.model.lora_alpha=8", f"{ARR}.actor.use_kl_loss=true",
        f"{ARR}.model.quantization=nf4",
        f"{ARR}.model.target_modules=[q_proj,v_proj]", "algorithm.adv_estimator=reinforce_plus_plus",
        f"{ARR}.actor.ppo_epochs=2", "trainer.test_freq=2"]


# Two ranks also sample dynamically (DAPO's filter on accuracy, rounds of 2 prompts): at the untrained
# policy's chance accuracy about half the groups of two responses agree and are dropped.
DYNAMIC = ["algorithm.filter_groups.enable=true", "data.gen_batch_size=2", "algorithm.filter_groups.metric=acc"]


@pytest.mark.parametrize("ranks, tp, extra", [(1, 1, LORA), (2, 2, BYPASS + DYNAMIC)],
                         ids=["1-lora", "2-tp2-bypass-dynamic"])
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
        # rollout.lora_sync=adapters, the default over an NF4 base too: each step's sync sent the engine
        # only the LoRA A/B tensors (2 layers x q, v x (A [4, 128] + B [out, 4]), fp32: 14,336 bytes; the
        # 4-bit base went once, at build), and the engine's log-probs still match the trainer's within
        # the merged sync's bound above.
        assert rows[-1]["perf/update_weights/adapters_only"] == 1.0
        assert rows[-1]["perf/update_weights/bytes"] == 2 * (4 * 128 + 128 * 4 + 4 * 128 + 64 * 4) * 4
        # The adapterless reference runs and the KL loss is reported; two optimizer steps per step: the
        # old-log-prob pass must run, and the second epoch sees a moved policy.
        assert "actor/kl_loss" in rows[-1] and "timing_s/ref" in rows[-1] and "timing_s/old_log_prob" in rows[-1]
        assert rows[-1]["actor/ppo_kl"] != 0.0
        # Validation at step 2 writes accuracy, per data source too, and its samples.
        assert "val/acc" in rows[-1] and "val/kk_role/acc" in rows[-1]
        assert (tmp_path / "run" / "val_generations" / "step_2.jsonl").is_file()
    else:
        # Bypass: no old-log-prob pass; the gap is measured in the loss, the weights self-normalised.
        assert "timing_s/old_log_prob" not in rows[-1] and abs(rows[-1]["rollout_corr/kl"]) < 1e-3
        assert rows[-1]["rollout_corr/rollout_is_batch_norm_factor"] == pytest.approx(1, abs=1e-3)
        # Rounds until 4 groups with a spread are kept: the metrics add up, and some groups were dropped.
        for row in rows:
            assert row["filter/groups_kept"] >= 4 and row["filter/gen_rounds"] == row["filter/prompts_consumed"] / 2
            assert row["filter/groups_kept"] + row["filter/groups_dropped"] == row["filter/prompts_consumed"]
            assert row["batch/responses"] == 8
        assert sum(row["filter/groups_dropped"] for row in rows) > 0
        # The sampler's record: each step's rounds follow the last step's, none skipped nor drawn twice.
        record = [json.loads(line) for line in (tmp_path / "run" / "prompts.jsonl").read_text().splitlines()]
        rounds = [draw["round"] for line in record for draw in line["draws"]]
        assert rounds == list(range(sum(int(row["filter/gen_rounds"]) for row in rows)))
        assert [len(line["draws"]) for line in record] == [row["filter/gen_rounds"] for row in rows]
        # Where the time went, per rank: both ranks' generation throughput and the tail between them.
        last = rows[-1]
        assert last["perf/gen_tokens_per_s/rank0"] > 0 and last["perf/gen_tokens_per_s/rank1"] > 0
        assert last["perf/gen_rank_tail"] >= 1.0 and last["perf/response_length_tail"] >= 1.0
        assert last["perf/update_actor/tokens_per_s"] > 0


@pytest.mark.slow
def test_each_verl_loss_trains_through_the_entry_point(tmp_path):
    # One step per loss (a multirun: a launch each), with token TIS and token + geometric rejection on.
    sweep = tmp_path / "sweep"
    modes = ",".join(BUILT_IN_LOSSES)
    result = run_main("-m", *ROLE_DATA, *SMALL, "trainer.total_training_steps=1", f"hydra.sweep.dir={sweep}",
                      f"{ARR}.actor.policy_loss.loss_mode={modes}", f"{CORR}.rollout_rs='token,geometric'",
                      f"{CORR}.rollout_rs_threshold='0.5_2.0,0.9_1.1'", f"trainer.default_local_dir={tmp_path}/ckpt",
                      cwd=tmp_path)
    assert result.returncode == 0, tail(result)
    for mode in modes.split(","):
        rows = [json.loads(line) for line in next(sweep.glob(f"*loss_mode={mode}*/metrics.jsonl")).read_text()
                .splitlines()]
        assert rows[-1]["actor/grad_norm"] > 0 and rows[-1]["rollout_corr/rollout_rs_masked_fraction"] == 0, mode
