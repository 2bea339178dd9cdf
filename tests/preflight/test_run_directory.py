"""A checkpoint directory holds one run, from the preflight (before Ray or a model): resume_mode=disable over
another run's checkpoints is refused, never overwritten in place, and a finished run that this launch differs
from is named with the way to start a new one. The README's commands one after another, in-process."""

from __future__ import annotations

import json

import pytest

from logicrl.checkpoint_layout import COMPLETE_MARKER, CONFIG_FILE, LATEST_FILE, STATE_FILE
from logicrl.config import compose, validate
from logicrl.config.errors import ConfigError
from logicrl.config.phases import ARR
from logicrl.preflight.checkpoints import check_fresh_start, check_not_done, write_run_shape
from tests.conftest import ROLE_DATA, assert_refused, check_main


def config(data_files, root, *overrides):
    cfg, _, plan = validate(compose([*data_files, f"{ARR}.rollout.name=hf", f"trainer.default_local_dir={root}",
                                     *overrides]))
    return cfg, plan


def finished(root, cfg, plan, roles=("actor",)):
    """What a run that trained all its steps leaves: its last checkpoint (shape.json, config.json, its state)."""
    step = plan.total_steps
    path = root / f"global_step_{step}"
    for role in roles:
        (path / role).mkdir(parents=True)
    write_run_shape(path, cfg)
    (path / STATE_FILE).write_text(json.dumps({"format": 1, "step": step, "sampler_position": step}))
    (path / COMPLETE_MARKER).write_text(f"{step}\n")
    (root / LATEST_FILE).write_text(f"{step}\n")
    return path


def test_disable_over_another_run_s_checkpoints_is_refused_with_the_command_to_move_them_aside(data_files, tmp_path):
    root = tmp_path / "ckpt"
    cfg, plan = config(data_files, root, "trainer.resume_mode=disable")
    check_fresh_start(cfg, root)  # nothing there yet: disable starts the run
    path = finished(root, cfg, plan)
    with pytest.raises(ConfigError) as err:
        check_fresh_start(cfg, root)
    assert str(err.value) == (
        f"trainer.resume_mode=disable, but trainer.default_local_dir={root} holds another run's checkpoints (up to "
        f"{path.name}), which starting over there would overwrite and mix with this run's: to start a new run, give "
        "it a directory of its own (trainer.default_local_dir=<another directory>) or move this one aside first: "
        f"mv {root} {root}.old; or drop trainer.resume_mode=disable to resume it")
    (tmp_path / "ckpt.old").mkdir()  # an earlier move: the command names a free name
    with pytest.raises(ConfigError, match=f"mv {root} {root}.old2;"):
        check_fresh_start(cfg, root)
    check_fresh_start(config(data_files, root, "trainer.resume_mode=disable", "trainer.val_only=true")[0], root)
    # A curriculum's checkpoints are in its stage directories.
    curriculum = tmp_path / "curriculum"
    finished(curriculum / "01_3ppl", cfg, plan)
    with pytest.raises(ConfigError, match=r"holds another run's checkpoints \(in its stage directories\)"):
        check_fresh_start(cfg, curriculum)


def test_a_finished_run_is_refused_only_when_this_launch_differs_from_it(data_files, tmp_path):
    root = tmp_path / "ckpt"
    cfg, plan = config(data_files, root)
    path = finished(root, cfg, plan)
    check_not_done(cfg, plan)  # the same run again: the trainer says there is nothing to train
    check_not_done(*config(data_files, root, "trainer.logger=[console,jsonl]", "trainer.verbose=true"))
    check_not_done(*config(data_files, root, "trainer.total_epochs=3"))  # more steps: it continues the run
    with pytest.raises(ConfigError) as err:
        check_not_done(*config(data_files, root, f"{ARR}.rollout.temperature=0.5", f"{ARR}.actor.optim.lr=1e-4"))
    assert str(err.value) == (
        f"trainer.default_local_dir={root} holds a finished run ({path.name}: step {plan.total_steps} of "
        f"{plan.total_steps}), and this launch differs from it ({ARR}.actor.optim.lr 0.0005 -> 0.0001, "
        f"{ARR}.rollout.temperature 1 -> 0.5): resuming it would train nothing; to start a new run, give it a "
        f"directory of its own (trainer.default_local_dir=<another directory>) or move this one aside first: "
        f"mv {root} {root}.old")
    (path / CONFIG_FILE).unlink()  # saved before config.json: nothing to compare, the trainer's line says it
    check_not_done(*config(data_files, root, f"{ARR}.rollout.temperature=0.5"))


def test_the_readme_s_commands_after_make_train(tmp_path):
    """`make train`'s finished run sits in the default directory, checkpoints/logicrl/kk_tiny (relative to
    where the user launches): a launch that differs is refused naming the run and the experiment_name that
    starts a new one; a named experiment, or the same command again, goes on."""
    cfg, _, plan = validate(compose([*ROLE_DATA]))
    root = tmp_path / "checkpoints" / "logicrl" / "kk_tiny"
    finished(root, cfg, plan)
    new_run = "give it a directory of its own (trainer.experiment_name=<new name>) or move this one aside first: " \
              "mv checkpoints/logicrl/kk_tiny checkpoints/logicrl/kk_tiny.old"
    two = assert_refused(check_main(*ROLE_DATA, "trainer.n_gpus=2", cwd=tmp_path), new_run,
                         f"holds a finished run (global_step_{plan.total_steps}: step {plan.total_steps} of "
                         f"{plan.total_steps}), and this launch differs from it (trainer.n_gpus 1 -> 2, "
                         "trainer.n_gpus_per_node 1 -> 2)")
    assert "resuming it would train nothing" in two
    assert_refused(check_main(*ROLE_DATA, "algorithm.adv_estimator=gae", cwd=tmp_path), new_run,
                   f"global_step_{plan.total_steps} holds no critic (it was saved with algorithm.adv_estimator=grpo)")
    for launch in (["trainer.n_gpus=2", "trainer.experiment_name=two_ranks"],
                   ["algorithm.adv_estimator=gae", "trainer.experiment_name=ppo"], []):
        result = check_main(*ROLE_DATA, *launch, cwd=tmp_path)
        assert result.code == 0, (launch, result.line)
