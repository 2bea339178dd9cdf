"""The divergence guard: a run whose updates keep coming out non-finite stops, and is never saved so.

    guard = DivergenceGuard(cfg.trainer.max_nonfinite_steps)
    reason = guard.observe(step, metrics)   # None, or why the run diverged

A step is non-finite when a role skipped an optimizer step for a non-finite gradient norm
(`<role>/nonfinite_steps`, workers/update.py) or its loss is NaN/inf. One such step can happen (a
bad batch under bf16) and costs only its skipped update; `max_nonfinite_steps` of them in a row is a
run that has diverged, and every further step would only burn GPU hours. Separately, the controller
asks the ranks before every save whether the weights and optimizer states are finite (workers/trained_state.py
`nonfinite_state`): a checkpoint is never written from NaN/inf, so the newest one on disk is finite.
"""

from __future__ import annotations

import math
from pathlib import Path

from omegaconf import DictConfig

from logicrl.config.models import MODELS, TRAINED

ROLES = TRAINED
# The key a user lowers for each role: a too-large learning rate is what diverges a run nearly always.
LR_KEYS = {m.name: m.lr_key for m in MODELS if m.trains}


def learning_rates(cfg: DictConfig) -> dict[str, float]:
    """Each trained role's learning rate, by role: what diverged_line names beside its key."""
    return {m.name: m.get(cfg, "lr_key") for m in MODELS if m.trains}


class Diverged(RuntimeError):
    """The run stopped because its values went non-finite; its message is the one line main_ppo prints."""


def nonfinite_roles(metrics: dict) -> list[str]:
    """The roles whose update this step skipped a step for a non-finite gradient norm or has a non-finite loss."""
    bad = []
    for role in ROLES:
        skipped = metrics.get(f"{role}/nonfinite_steps", 0.0)
        loss = metrics.get(f"{role}/loss", 0.0)
        if skipped > 0 or not math.isfinite(skipped) or not math.isfinite(loss):
            bad.append(role)
    return bad


class DivergenceGuard:
    """Counts the non-finite steps in a row; says when they reach the limit."""

    def __init__(self, limit: int):
        self.limit = limit
        self.streak: list[int] = []  # the steps of the current run of non-finite ones
        self.roles: set[str] = set()

    def observe(self, step: int, metrics: dict) -> str | None:
        """Record `step`'s metrics; the reason the run diverged once `limit` non-finite steps came in a row."""
        roles = nonfinite_roles(metrics)
        if not roles:
            self.streak, self.roles = [], set()
            return None
        self.streak.append(step)
        self.roles.update(roles)
        if len(self.streak) < self.limit:
            return None
        names = " and ".join(r for r in ROLES if r in self.roles)
        steps = f"{len(self.streak)} steps in a row ({self.streak[0]}-{step})" if len(self.streak) > 1 else \
            f"step {step}"
        return (f"{steps} had a non-finite {names} gradient norm or loss (trainer.max_nonfinite_steps="
                f"{self.limit}), their updates skipped")


REJECTED = "rollout_corr/rollout_rs_masked_fraction"
ALL_REJECTED_STEPS = 3  # a step or two may be all off-policy (a first sync); this many in a row is the config


class RejectionGuard:
    """Rollout rejection (algorithm.rollout_correction.rollout_rs) that masks every token trains on nothing,
    its gradient 0: validation refuses bands that cannot hold ratio 1, this catches the rest (a k2/k3 bound
    below every token's divergence) after ALL_REJECTED_STEPS steps in a row."""

    def __init__(self, corr):
        self.corr, self.streak = corr, []

    def observe(self, step: int, metrics: dict) -> str | None:
        """The line that ends the run, once every token was rejected ALL_REJECTED_STEPS steps in a row."""
        if metrics.get(REJECTED, 0.0) < 1.0:
            self.streak = []
            return None
        self.streak.append(step)
        if len(self.streak) < ALL_REJECTED_STEPS:
            return None
        key = "algorithm.rollout_correction"
        return (f"steps {self.streak[0]}-{step} rejected every token ({REJECTED} 1.0), so nothing was trained: "
                f"{key}.rollout_rs={self.corr.rollout_rs} with rollout_rs_threshold={self.corr.rollout_rs_threshold} "
                "rejects everything; widen the threshold, or set rollout_rs=null")


def nonfinite_state_reason(parts: list[str], step: int) -> str:
    """Why step `step` was not saved: `parts` ("actor weights", ...) hold NaN or inf."""
    return f"the {' and '.join(parts)} hold NaN or inf after step {step}, which was not saved"


def diverged_line(reason: str, roles: list[str], lrs: dict[str, float], last: tuple[int, Path] | None,
                  start_over: str, unverified: bool = False, resumed: bool = False, older: Path | None = None) -> str:
    """The one line a diverged run ends with: what happened, the knob, and the checkpoint to resume from.

    A resumed run takes this launch's lr (trainer/resumed.py), so "lower it and run again" resumes the
    checkpoint at the lower lr. `unverified`: the checkpoint named is the one this run resumed without a
    manifest, so nothing vouches that it is sound: the line says so rather than "finite". `resumed`: not one
    step since this launch resumed `last` was finite, so the checkpoint's weights are likely past saving
    already (finite is not sound: a too-large lr throws them far in one update), and resuming it again at
    any lr would diverge again: the line names `older` (the checkpoint before it) instead. `start_over`:
    how to start a new run in a directory of its own."""
    knobs = " or ".join(f"{LR_KEYS[r]} (now {lrs[r]:g})" for r in ROLES if r in roles) or \
        f"{LR_KEYS['actor']} (now {lrs['actor']:g})"
    if resumed and last is not None:
        back = f"resume an older checkpoint (trainer.resume_mode={older})" if older else "there is no older one"
        return (f"the run diverged: {reason}, and not one step since it resumed {last[1]} was finite: that "
                f"checkpoint's weights are likely past saving already (finite, not sound: the lr of the steps "
                f"before it), and resuming it again would diverge again: lower {knobs}, and {back}; or, "
                f"{start_over}")
    if last is None:
        where = "no checkpoint was saved before it"
    elif unverified:
        where = (f"the last checkpoint, {last[1]}, is from step {last[0]} and was resumed without a MANIFEST.json "
                 f"to verify it against: a damaged file in it would do this too ({start_over})")
    else:
        where = f"the last checkpoint, {last[1]}, is from step {last[0]} and finite ({start_over})"
    return f"the run diverged: {reason}: lower {knobs} and run again, which resumes it at the lower value; {where}"
