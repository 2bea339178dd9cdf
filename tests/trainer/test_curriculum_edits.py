"""A finished curriculum stage edited before a re-run (trainer/curriculum.py): refused in one line
naming what changed, since the stage is not trained again; a re-run that changes only how stages
run (devices, micro-batches, logging) is the same curriculum and goes on."""

from __future__ import annotations

from pathlib import Path

import pytest

from logicrl.config import ConfigError
from logicrl.config.phases import ARR
from logicrl.trainer.curriculum import finished_changes, finished_row, refuse_edited
from tests.conftest import stages_of, two_stages


def record(stages, steps: int = 3) -> dict:
    """The record after stage s1 finished at global_step_<steps> (as run_curriculum writes it)."""
    s1 = stages[0]
    return {s1.name: finished_row(s1, [{"step": 1, "reward": 0.5}], 1.0, Path(f"/ck/run/01_s1/global_step_{steps}"))}


def test_the_same_stage_again_is_not_an_edit(stage_files):
    stages = stages_of(two_stages(stage_files))
    done = record(stages)
    assert finished_changes(stages[0], done["s1"]) == []
    refuse_edited(stages, done)  # nothing raised: the curriculum goes on with s2


@pytest.mark.parametrize("rerun", [
    ["trainer.n_gpus=2", f"{ARR}.actor.ppo_micro_batch_size_per_gpu=2", "trainer.logger=[console]",
     "trainer.save_freq=1", f"{ARR}.actor.fsdp_config.param_offload=true"],
    ["trainer.test_freq=1", "trainer.experiment_name=other"],
])
def test_how_a_stage_runs_may_change(stage_files, rerun):
    done = record(stages_of(two_stages(stage_files)))
    stages = stages_of(two_stages(stage_files, *rerun))
    assert finished_changes(stages[0], done["s1"]) == []


def test_an_edited_finished_stage_is_refused_naming_each_change(stage_files):
    done = record(stages_of(two_stages(stage_files)))
    # The recipe's stage 1 edited (its overlay), and a command-line value that applies to every stage.
    edit = "++curriculum.stages.0.overrides.actor_rollout_ref.actor.optim.lr=0.001"
    edited = stages_of(two_stages(stage_files, edit, "data.train_batch_size=4"))
    assert finished_changes(edited[0], done["s1"]) == [
        "actor_rollout_ref.actor.optim.lr 0.0005 -> 0.001",  # conf/'s 5.0e-4 -> the edit
        "actor_rollout_ref.actor.ppo_mini_batch_size 8 -> 4",  # the resolved config: clamped to the batch
        "data.train_batch_size 8 -> 4"]
    with pytest.raises(ConfigError) as refused:
        refuse_edited(edited, done)
    line = str(refused.value)
    assert line.startswith("curriculum stage 1/2 (s1) already finished with other settings than it has now: "
                           "actor_rollout_ref.actor.optim.lr 0.0005 -> 0.001, "
                           "actor_rollout_ref.actor.ppo_mini_batch_size 8 -> 4, data.train_batch_size 8 -> 4; ")
    assert "+curriculum.stages.<index>.overrides.<key>=<value>); or, to start a new run, give it a directory of its " \
        "own" in line and " or move this one aside first: mv " in line


def test_a_finished_stage_made_shorter_is_refused(stage_files):
    done = record(stages_of(two_stages(stage_files)), steps=5)  # it finished at step 5; s1 now has 3 steps
    stages = stages_of(two_stages(stage_files))
    assert finished_changes(stages[0], done["s1"]) == ["steps 5 -> 3"]


def test_a_record_from_before_configs_were_kept_is_not_compared(stage_files):
    stages = stages_of(two_stages(stage_files, "data.train_batch_size=4"))
    done = record(stages_of(two_stages(stage_files)))
    del done["s1"]["config"]
    assert finished_changes(stages[0], done["s1"]) == []
