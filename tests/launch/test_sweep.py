"""Sweeps: jobs named by their swept values, every job checked before the first starts, one bad
job failing alone, and a summary of all of them at the end (logicrl/launch/sweep.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from logicrl.config import check_overrides
from logicrl.config.errors import ConfigError
from logicrl.config.plan import ARR
from logicrl.launch.sweep import job_name, short_names, swept_keys
from tests.conftest import run_main, tail
from tests.launch.conftest import summary_rows

ROOT = Path(__file__).resolve().parents[2]
SEVEN_B = ["actor_rollout_ref.model.path=logicrl/memory/shapes/qwen2.5-7b", "trainer.n_gpus=4",
           "trainer.gpu_memory_gb=80", "data.max_response_length=4096", f"{ARR}.actor.ppo_micro_batch_size_per_gpu=4",
           "algorithm.adv_estimator=grpo", "data.train_batch_size=16", "data.max_prompt_length=128"]


def planned_generate_gb() -> float:
    from logicrl.config import compose, validate
    from logicrl.memory.planner import plan_inputs
    from logicrl.preflight.memory import peaks_gb, plan_for

    # Refused as it is: the planner's peaks, not check_memory's.
    x, cap, _ = plan_for(*validate(compose([*SEVEN_B, f"{ARR}.rollout.n=8"])))
    return peaks_gb(plan_inputs(x, cap))["generate"]


def test_hydra_group_overrides_pass_the_override_check():
    argv = ["-m", "hydra/launcher=submitit_slurm", "hydra/sweeper=basic", "hydra.launcher.partition=debug", "a=1"]
    with pytest.raises(ConfigError, match="unknown config key `a`"):
        check_overrides(argv)
    assert check_overrides(argv[:-1]) == argv[:-1]


def test_swept_keys_are_the_ones_with_several_values():
    overrides = ["trainer.dry_run=true", f"{ARR}.rollout.n=8,16", "data.train_batch_size=range(4,12,4)",
                 "hydra.launcher.timeout_min=5,6", "+x=choice(a,b)"]
    assert swept_keys(overrides) == [f"{ARR}.rollout.n", "data.train_batch_size", "x"]


def test_a_job_is_named_by_its_swept_values_shortened():
    swept = [f"{ARR}.rollout.n", "data.train_batch_size"]
    task = ["trainer.dry_run=True", f"{ARR}.rollout.n=4", "data.train_batch_size=8"]
    assert job_name(task, swept) == "rollout.n=4,data.train_batch_size=8"
    # Without the list (a job started outside a sweep callback): every override but Hydra's.
    assert job_name(["hydra.job.chdir=false", "trainer.seed=3"], None) == "trainer.seed=3"
    assert job_name([], []) == "job"


def test_short_names_stay_distinct():
    keys = [f"{ARR}.actor.optim.lr", "critic.optim.lr", f"{ARR}.rollout.n"]
    assert short_names(keys) == {keys[0]: "actor.optim.lr", keys[1]: "critic.optim.lr", keys[2]: "rollout.n"}


def test_names_are_safe_and_bounded():
    name = job_name([f"data.train_files=/data/{'x' * 200}/train.parquet"], ["data.train_files"])
    assert "/" not in name and len(name) <= 100
    assert name != job_name([f"data.train_files=/data/{'x' * 201}/train.parquet"], ["data.train_files"])


@pytest.mark.integration
def test_a_bad_value_fails_only_its_own_job_and_is_said_before_the_first_starts(tmp_path):
    sweep = tmp_path / "sweep"
    result = run_main("-m", "trainer.dry_run=true", f"{ARR}.rollout.n=0,4", f"hydra.sweep.dir={sweep}", cwd=ROOT)
    assert result.returncode == 1, tail(result)
    out = result.stdout
    said = out.index("logicrl sweep: 1 of 2 job(s) cannot run as given")
    assert "rollout.n=0: error: actor_rollout_ref.rollout.n=0 must be >= 1" in out[said:]
    assert said < out.index("logicrl dry run")  # before the first job ran
    assert sorted(p.name for p in sweep.iterdir() if p.is_dir()) == ["rollout.n=0", "rollout.n=4"]
    rows = summary_rows(sweep)
    assert "| failed |" in rows["rollout.n=0"] and "must be >= 1" in rows["rollout.n=0"]
    assert "| done (planned) |" in rows["rollout.n=4"]
    planned = json.loads((sweep / "rollout.n=4" / "result.json").read_text())["planned_peak_gb"]
    assert set(planned) >= {"generate", "update_actor"} and all(gb > 0 for gb in planned.values())
    assert (sweep / "sweep_summary.png").stat().st_size > 1000


@pytest.mark.integration
def test_a_dry_run_sweep_is_the_table_of_what_fits(tmp_path):
    sweep = tmp_path / "sweep"
    result = run_main("-m", "trainer.dry_run=true", *SEVEN_B, f"{ARR}.rollout.n=8,16",
                      f"{ARR}.model.enable_gradient_checkpointing=true,false", f"hydra.sweep.dir={sweep}", cwd=ROOT)
    assert result.returncode == 1, tail(result)
    rows = summary_rows(sweep)
    generate_gb = planned_generate_gb()
    # In the sweep's order; Hydra writes booleans True/False in a job's overrides.
    assert list(rows) == [f"rollout.n={n},model.enable_gradient_checkpointing={gc}"
                          for n in (8, 16) for gc in ("True", "False")]
    for name, line in rows.items():
        fits = name.endswith("=True")
        assert ("| done (planned) |" in line) == fits, line
        if not fits:  # refused, with the planned peaks and the setting that makes it fit
            assert "| refused by the planner |" in line and "update_actor needs" in line, line
            assert "enable_gradient_checkpointing=true" in line.split("update_actor needs")[1]
        # generate's planned peak, in every row (rollout.n and checkpointing leave generate alone):
        # the planner's own number for this shape, so a change in the model does not break the table test.
        assert f"| {generate_gb:.2f} |" in line
