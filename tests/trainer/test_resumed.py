"""What a resumed run takes from this launch: each changed hyperparameter named (old -> new), the other changed
keys in one line, and the KL coefficient the reward's controller continues from. The ranks' side (the configured
lr and weight decay put back after a load): tests/workers/test_lr_schedule.py."""

from __future__ import annotations

import json
from pathlib import Path

from logicrl.config import compose
from logicrl.config.flat import flat_config
from logicrl.config.phases import ARR
from logicrl.trainer.checkpoint import TrainerState
from logicrl.trainer.resumed import kl_start, recorded, resume_lines

LR = f"{ARR}.actor.optim.lr"
KL_IN_REWARD = ["algorithm.use_kl_in_reward=true"]
CHECKPOINT = Path("/ckpt/global_step_2")  # only its name is read


def state(kl_coef: float | None = None) -> TrainerState:
    return TrainerState(step=2, sampler_position=2, kl_coef=kl_coef)


def test_each_changed_hyperparameter_is_one_line_and_the_rest_one_line_together():
    old = flat_config(compose([f"{LR}=1e8", f"{ARR}.rollout.temperature=1.0", "trainer.logger=[console]"]))
    cfg = compose([f"{LR}=1e-4", f"{ARR}.actor.optim.lr_warmup_steps=3", f"{ARR}.rollout.temperature=0.7",
                   "trainer.logger=[jsonl]"])
    lines = resume_lines(CHECKPOINT, state(), cfg, old)
    assert lines == [
        f"{ARR}.actor.optim.lr: 1e+08 -> 0.0001 (this launch's value replaces global_step_2's)",
        f"{ARR}.actor.optim.lr_warmup_steps: -1 -> 3 (this launch's value replaces global_step_2's)",
        # How a run is watched (the logger) is not a change of the run.
        f"this launch differs from the run in global_step_2 in {ARR}.rollout.temperature 1 -> 0.7: its values "
        "apply from step 3"]
    assert resume_lines(CHECKPOINT, state(), cfg, flat_config(cfg)) == []


def test_the_kl_coefficients_are_this_launch_s_and_an_adaptive_controller_continues_only_from_the_same_start():
    fixed = compose([*KL_IN_REWARD, "algorithm.kl_ctrl.kl_coef=0.01"])
    was = flat_config(compose([*KL_IN_REWARD, "algorithm.kl_ctrl.kl_coef=0.001"]))
    assert kl_start(fixed, state(0.001), was) == 0.01
    assert resume_lines(CHECKPOINT, state(0.001), fixed, was) == [
        "algorithm.kl_ctrl.kl_coef: 0.001 -> 0.01 (this launch's value replaces global_step_2's)"]

    adaptive = [*KL_IN_REWARD, "algorithm.kl_ctrl.type=adaptive", "algorithm.kl_ctrl.target_kl=0.1"]
    started = flat_config(compose([*adaptive, "algorithm.kl_ctrl.kl_coef=0.001"]))
    same = compose([*adaptive, "algorithm.kl_ctrl.kl_coef=0.001"])
    assert kl_start(same, state(0.0013), started) == 0.0013  # where it had moved: the run goes on as if never stopped
    other = compose([*adaptive, "algorithm.kl_ctrl.kl_coef=0.02"])
    assert kl_start(other, state(0.0013), started) == 0.02
    assert resume_lines(CHECKPOINT, state(0.0013), other, started) == [
        "algorithm.kl_ctrl.kl_coef: 0.001 -> 0.02 (this launch's value replaces global_step_2's); the adaptive "
        "controller, at 0.0013 when saved, restarts from 0.02"]
    # The actor's KL loss coefficient, read each step from the config, is named too when the run uses it.
    loss = [f"{ARR}.actor.use_kl_loss=true"]
    lines = resume_lines(CHECKPOINT, state(), compose([*loss, f"{ARR}.actor.kl_loss_coef=0.01"]),
                         flat_config(compose([*loss, f"{ARR}.actor.kl_loss_coef=0.001"])))
    assert lines == [f"{ARR}.actor.kl_loss_coef: 0.001 -> 0.01 (this launch's value replaces global_step_2's)"]


def test_a_checkpoint_from_before_config_json_still_shows_its_lr_and_fixed_kl_coefficient(tmp_path):
    checkpoint = tmp_path / "global_step_2"
    (checkpoint / "actor").mkdir(parents=True)
    (checkpoint / "actor" / "lr_scheduler.json").write_text(json.dumps({"base_lrs": [1e8], "last_epoch": 2}))
    cfg = compose([*KL_IN_REWARD, f"{LR}=1e-4"])
    old = recorded(checkpoint, state(0.05), cfg)
    assert old == {LR: 1e8, "algorithm.kl_ctrl.kl_coef": 0.05}
    assert resume_lines(checkpoint, state(0.05), cfg, old) == [
        f"{LR}: 1e+08 -> 0.0001 (this launch's value replaces global_step_2's)",
        "algorithm.kl_ctrl.kl_coef: 0.05 -> 0.001 (this launch's value replaces global_step_2's)"]
    (checkpoint / "config.json").write_text(json.dumps(flat_config(cfg)))
    assert recorded(checkpoint, state(0.05), cfg) == flat_config(cfg)
