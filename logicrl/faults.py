"""Deterministic fault injection, for the tests that prove crash-safety and OOM recovery.

    LOGICRL_INJECT_FAULT="sigkill@update_actor:3"      the controller SIGKILLs itself in step 3's update_actor
    LOGICRL_INJECT_FAULT="sigkill@save:4,oom@generate:2"    several, comma-separated
    LOGICRL_INJECT_FAULT="sigkill@update_actor:2#2"    only in curriculum stage 2 (1-based)

A fault is `kind@point:step[#stage]`. Points are the step's phase names (config/plan.PHASES) plus
`save` (after the ranks wrote a checkpoint, before it is committed). Kinds: `sigkill` (the
controller dies like a killed job: no cleanup, no atexit), `oom` (a worker's phase raises
torch.OutOfMemoryError, what a CUDA OOM raises, at the end of its first attempt in that step, so
the retry must drop everything the attempt accumulated), `raise` (a worker's phase raises a
RuntimeError, as a bug would) and `die` (a worker process exits at once, as one killed by the
kernel's OOM killer does).

The entry point reads the variable once (`Faults.from_env`) and passes the object down: the
controller's phase runner and the workers' phase wrapper are the only places that fire it.
A real SIGKILL at a random time is what users see; a fixed point makes the test reproducible
and lets it hit the narrow windows (mid-save) on purpose.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass, field, replace

ENV = "LOGICRL_INJECT_FAULT"
KINDS = ("sigkill", "oom", "raise", "die")


def parse(spec: str) -> dict[tuple[str, int, int | None], str]:
    faults = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        try:
            kind, where = item.split("@")
            where, _, stage = where.partition("#")
            point, step = where.split(":")
            faults[(point, int(step), int(stage) if stage else None)] = kind
        except ValueError:
            raise ValueError(f"{ENV}: cannot parse {item!r}; write kind@point:step[#stage], "
                             "e.g. sigkill@update_actor:3") from None
        if kind not in KINDS:
            raise ValueError(f"{ENV}: unknown fault kind {kind!r} in {item!r}: use {', '.join(KINDS)}")
    return faults


@dataclass
class Faults:
    """The faults asked for; empty (the normal case) costs one dict lookup per phase."""

    points: dict[tuple[str, int, int | None], str] = field(default_factory=dict)
    stage: int | None = None  # the 0-based curriculum stage this run is (None outside a curriculum)
    # An `oom` fires once per (point, step) in a process, as a transient OOM would: the phase's
    # retry with a smaller micro-batch then goes through.
    fired: set[tuple[str, int]] = field(default_factory=set)

    @classmethod
    def from_env(cls) -> Faults:
        return cls(parse(os.environ.get(ENV, "")))

    def in_stage(self, stage: int | None) -> Faults:
        return replace(self, stage=stage, fired=set())

    def _kind(self, point: str, step: int | None) -> str | None:
        if not self.points or step is None:
            return None
        kind = self.points.get((point, step, None))
        if kind is None and self.stage is not None:
            kind = self.points.get((point, step, self.stage + 1))
        return kind

    def kill_if_due(self, point: str, step: int | None) -> None:
        """The controller: die here if a sigkill is asked for at (point, step)."""
        if self._kind(point, step) == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)

    def fail_worker_if_due(self, point: str, step: int | None) -> None:
        """A worker phase, as it starts: raise or die if asked to at (point, step)."""
        kind = self._kind(point, step)
        if kind == "raise":
            raise RuntimeError(f"injected fault in {point} at step {step} ({ENV})")
        if kind == "die":
            os._exit(1)

    def oom_due(self, point: str, step: int | None) -> bool:
        """A worker phase: whether to raise an injected OOM now (once per point and step)."""
        if self._kind(point, step) != "oom" or (point, step) in self.fired:
            return False
        self.fired.add((point, step))
        return True
