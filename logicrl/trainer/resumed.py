"""What a resumed run takes from its checkpoint, and what from this launch.

The checkpoint gives the weights, AdamW's moments, the schedule's position, the data order and RNG,
and the KL coefficient an adaptive controller had moved to (while this launch starts it as the run did).
This launch's config gives everything else, the optimizer's hyperparameters and the KL coefficients
included: the ranks put the configured lr and weight decay back after loading (workers/checkpoint.py
keep_configured), so the divergence line's advice, a lower lr, takes effect. Each hyperparameter that
changed is one line, old -> new; the other changed keys one line together. The old values are the
checkpoint's config.json; one saved before it existed still shows its lr (lr_scheduler.json) and a
fixed controller's coefficient (trainer_state.json).
"""

from __future__ import annotations

import json
from pathlib import Path

from omegaconf import DictConfig

from logicrl.config.flat import LAUNCH_ONLY, differences, flat_config, show
from logicrl.config.models import MODELS
from logicrl.config.plan import ARR
from logicrl.preflight.checkpoints import saved_config
from logicrl.trainer.checkpoint import TrainerState
from logicrl.workers.checkpoint import SCHEDULER_FILE

OPTIM = ("lr", "lr_warmup_steps_ratio", "lr_warmup_steps", "lr_scheduler_type", "weight_decay")
KL_CTRL = ("kl_ctrl.type", "kl_ctrl.kl_coef", "kl_ctrl.target_kl", "kl_ctrl.horizon")
SHOWN = 6  # the line of other changes lists this many keys, then a count


def hyperparameters(cfg: DictConfig) -> list[str]:
    """The keys whose change on resume gets a line of its own: each trained role's optimizer, and the KL
    coefficients this run uses (the reward's controller, the actor's loss term)."""
    keys = [f"{m.prefix}.optim.{name}" for m in MODELS if m.trains and m.in_use(cfg) for name in OPTIM]
    if cfg.algorithm.use_kl_in_reward:
        keys += [f"algorithm.{key}" for key in KL_CTRL]
    if cfg[ARR].actor.use_kl_loss:
        keys.append(f"{ARR}.actor.kl_loss_coef")
    return keys


def recorded(checkpoint: Path, state: TrainerState, cfg: DictConfig) -> dict:
    """The flat config the checkpoint's run had; for one saved before config.json, what its files still say."""
    saved = saved_config(checkpoint)
    if saved is not None:
        return saved
    old: dict = {}
    for m in MODELS:
        try:
            old[m.lr_key] = json.loads((checkpoint / m.name / SCHEDULER_FILE).read_text())["base_lrs"][0]
        except (OSError, ValueError, KeyError, IndexError, TypeError):
            pass  # not a trained role, or not one this checkpoint holds
    if state.kl_coef is not None and cfg.algorithm.kl_ctrl.type == "fixed":
        old["algorithm.kl_ctrl.kl_coef"] = state.kl_coef  # a fixed controller's value is its coefficient
    return old


def kl_start(cfg: DictConfig, state: TrainerState, old: dict) -> float:
    """The reward's KL coefficient after resuming: the value an adaptive controller had reached, when this
    launch starts it as the saved run did; else (a fixed one, or another start or type) this launch's."""
    k = cfg.algorithm.kl_ctrl
    same_start = (old.get("algorithm.kl_ctrl.type", k.type) == k.type
                  and old.get("algorithm.kl_ctrl.kl_coef", k.kl_coef) == k.kl_coef)
    if k.type == "adaptive" and same_start and state.kl_coef is not None:
        return float(state.kl_coef)
    return float(k.kl_coef)


def resume_lines(checkpoint: Path, state: TrainerState, cfg: DictConfig, old: dict) -> list[str]:
    """One line per hyperparameter this launch changes, then one for every other changed key."""
    now = flat_config(cfg)
    keys = hyperparameters(cfg)
    where = f"{checkpoint.name}'s"
    lines = []
    for key, was, new in differences(old, now):
        if key not in keys:
            continue
        line = f"{key}: {show(was)} -> {show(new)} (this launch's value replaces {where})"
        if key == "algorithm.kl_ctrl.kl_coef" and cfg.algorithm.kl_ctrl.type == "adaptive" and state.kl_coef:
            line += f"; the adaptive controller, at {show(state.kl_coef)} when saved, restarts from {show(new)}"
        lines.append(line)
    others = [(k, was, new) for k, was, new in differences(old, now, LAUNCH_ONLY) if k not in keys]
    if others:
        shown = ", ".join(f"{k} {show(was)} -> {show(new)}" for k, was, new in others[:SHOWN])
        more = f" and {len(others) - SHOWN} more" if len(others) > SHOWN else ""
        lines.append(f"this launch differs from the run in {checkpoint.name} in {shown}{more}: its values apply "
                     f"from step {state.step + 1}")
    return lines
