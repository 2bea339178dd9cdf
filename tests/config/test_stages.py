"""Curriculum stages: base + stage overlay + command line, every stage validated up front."""

import pytest

from logicrl.config import ConfigError
from logicrl.config.phases import ARR
from logicrl.config.stages import has_stages
from tests.conftest import run_main, stages_of, two_stages


def test_each_stage_is_base_plus_its_overlay(stage_files):
    s1, s2 = stages_of(two_stages(stage_files))
    assert (s1.name, s2.name) == ("s1", "s2")
    assert s1.cfg.data.train_files == stage_files["a"] and s2.cfg.data.train_files == stage_files["b"]
    assert (s1.cfg.data.train_batch_size, s2.cfg.data.train_batch_size) == (8, 4)
    assert (s1.cfg[ARR].rollout.n, s2.cfg[ARR].rollout.n) == (8, 4)  # s1 keeps conf/'s n=8
    assert s2.cfg[ARR].rollout.temperature == 0.5 and s2.cfg[ARR].actor.optim.lr == 1e-6
    assert s1.cfg.trainer.total_training_steps == 3 and s2.cfg.trainer.total_training_steps is None
    # The validation set stays the base's, and the batch plan follows each stage's own sizes.
    assert s1.cfg.data.val_files == s2.cfg.data.val_files == stage_files["val"]
    assert (s1.plan.responses, s2.plan.responses) == (64, 16)
    # Own checkpoint directory and experiment name per stage; the stages themselves are not nested.
    assert s1.cfg.trainer.default_local_dir == "/ck/run/01_s1"
    assert s2.cfg.trainer.default_local_dir == "/ck/run/02_s2"
    assert s2.cfg.trainer.experiment_name == "kk_tiny-s2"
    assert not has_stages(s1.cfg)


def test_the_command_line_wins_over_every_stage(stage_files):
    # Listed after the stages, as a user would type it after +recipe=...
    s1, s2 = stages_of(two_stages(stage_files, "data.train_batch_size=2", f"{ARR}.rollout.temperature=0.3"))
    assert (s1.cfg.data.train_batch_size, s2.cfg.data.train_batch_size) == (2, 2)
    assert s1.cfg[ARR].rollout.temperature == s2.cfg[ARR].rollout.temperature == 0.3
    assert s2.cfg[ARR].rollout.n == 4  # what the command line does not name stays the stage's


def test_one_stage_can_be_changed_from_the_command_line(stage_files):
    s1, s2 = stages_of(two_stages(stage_files, "+curriculum.stages.1.overrides.trainer.critic_warmup=5"))
    assert (s1.cfg.trainer.critic_warmup, s2.cfg.trainer.critic_warmup) == (0, 5)


@pytest.mark.parametrize("extra, needles", [
    (["+curriculum.stages.1.overrides.data.trian_files=x"], ["curriculum stage 2 (s2)", "data.trian_files",
                                                              "did you mean `data.train_files`"]),
    (["curriculum.stages.1.overrides.data.train_batch_size=0"], ["curriculum stage 2 (s2)", "train_batch_size"]),
    (["curriculum.stages.1.name=s1"], ["curriculum.stages[1].name='s1' is used twice"]),
    (["curriculum.stages.0.name=a/b"], ["curriculum.stages[0].name='a/b'"]),
    (["+curriculum.stages.0.steps=3"], ["curriculum.stages[0] has unknown field(s) ['steps']"]),
    (["trainer.resume_mode=/some/global_step_3"], ["a curriculum resumes by itself"]),
])
def test_bad_stages_are_one_line_errors_naming_the_stage(stage_files, extra, needles):
    with pytest.raises(ConfigError) as err:
        stages_of(two_stages(stage_files, *extra))
    message = str(err.value)
    assert "\n" not in message
    for needle in needles:
        assert needle in message, message


@pytest.mark.integration
def test_a_bad_last_stage_stops_the_entry_point_before_anything_runs(stage_files, tmp_path):
    result = run_main(*two_stages(stage_files, "+curriculum.stages.1.overrides.algorithm.adv_estimator=nope"),
                      cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith(
        "error: curriculum stage 2 (s2): algorithm.adv_estimator=nope is not one of")
    assert "stage 1/2" not in result.stdout  # nothing was printed as started
    assert not (tmp_path / "outputs").exists() or not list((tmp_path / "outputs").rglob("metrics.jsonl"))
