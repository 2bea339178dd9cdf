"""Deterministic fault injection, for the tests that prove crash-safety and OOM recovery.

    LOGICRL_INJECT_FAULT="sigkill@update_actor:3"      the controller SIGKILLs itself in step 3's update_actor
    LOGICRL_INJECT_FAULT="oom@update_actor:2@rank1"    only on rank 1 (several faults: comma-separated)

A fault is `kind@point:step[#stage][@rankN]`; points are the phase names (config/plan.PHASES) plus
`save` (the ranks wrote, nothing committed). Kinds: sigkill (the controller, no cleanup), oom (on every
rank at the end of the first attempt, after its collectives: the case the ranks retry; with @rankN
inside the first decoder layer's forward: the real case, which ends the run), raise, die (the worker
process exits), stall (sleeps STALL_S, so a signal test knows the step is in flight), nan (after the
phase, the weights of its FSDP2 model go NaN: what a diverged update leaves), enospc and erofs
(at `save` only: the ranks' first checkpoint write fails as on a full disk or a read-only file
system; the tests run as root, whom chmod does not stop), taken (at `ray_start` only, its number the SLURM
job's restart count: the wrapper's head node holds the port it chose for Ray's client server before its
first `ray start`, as another process taking it between choice and bind would). docs/faults.md.

The entry point reads the variable once (`Faults.from_env`); the controller's phase runner and the
workers' phase wrapper are the only places that fire it, at fixed points a test can aim at (mid-save).
"""

from __future__ import annotations

import errno
import os
import signal
import time
from dataclasses import dataclass, field, replace
from typing import NamedTuple

ENV = "LOGICRL_INJECT_FAULT"
KINDS = ("sigkill", "oom", "raise", "die", "stall", "nan", "enospc", "erofs", "taken")
DISK_ERRORS = {"enospc": errno.ENOSPC, "erofs": errno.EROFS}
STALL_S = 60.0


class Fault(NamedTuple):
    kind: str
    rank: int | None = None  # None: every rank


def parse(spec: str) -> dict[tuple[str, int, int | None], Fault]:
    faults = {}
    for item in filter(None, (s.strip() for s in spec.split(","))):
        try:
            kind, where, *on = item.split("@")
            if len(on) > 1 or (on and not on[0].startswith("rank")):
                raise ValueError
            rank = int(on[0].removeprefix("rank")) if on else None
            where, _, stage = where.partition("#")
            point, step = where.split(":")
            faults[(point, int(step), int(stage) if stage else None)] = Fault(kind, rank)
        except ValueError:
            raise ValueError(f"{ENV}: cannot parse {item!r}; write kind@point:step[#stage][@rankN], "
                             "e.g. sigkill@update_actor:3 or oom@update_actor:2@rank1") from None
        if kind not in KINDS:
            raise ValueError(f"{ENV}: unknown fault kind {kind!r} in {item!r}: use {', '.join(KINDS)}")
        if kind in DISK_ERRORS and point != "save":
            raise ValueError(f"{ENV}: {item!r}: {kind} fails a checkpoint write: its point is save, e.g. {kind}@save:2")
        if (kind == "taken") != (point == "ray_start"):
            raise ValueError(f"{ENV}: {item!r}: a port is taken at ray_start, its number the SLURM job's restart "
                             "count, e.g. taken@ray_start:1 (the requeued run)")
        if kind == "sigkill" and rank is not None:
            raise ValueError(f"{ENV}: {item!r}: sigkill kills the controller, which has no rank: drop @rank{rank}")
    return faults


@dataclass
class Faults:
    """The faults asked for; empty (the normal case) costs one dict lookup per phase."""

    points: dict[tuple[str, int, int | None], Fault] = field(default_factory=dict)
    stage: int | None = None  # the 0-based curriculum stage this run is (None outside a curriculum)
    # An `oom` fires once per (point, step) in a process, as a transient OOM would: the phase's
    # retry with a smaller micro-batch then goes through.
    fired: set[tuple[str, int]] = field(default_factory=set)

    @classmethod
    def from_env(cls) -> Faults:
        return cls(parse(os.environ.get(ENV, "")))

    def in_stage(self, stage: int | None) -> Faults:
        return replace(self, stage=stage, fired=set())

    def _fault(self, point: str, step: int | None, rank: int | None = None) -> Fault | None:
        if not self.points or step is None:
            return None
        fault = self.points.get((point, step, None))
        if fault is None and self.stage is not None:
            fault = self.points.get((point, step, self.stage + 1))
        if fault is not None and fault.rank is not None and fault.rank != rank:
            return None
        return fault

    def _kind(self, point: str, step: int | None, rank: int | None = None) -> str | None:
        fault = self._fault(point, step, rank)
        return None if fault is None else fault.kind

    def kill_if_due(self, point: str, step: int | None) -> None:
        """The controller: die here if a sigkill is asked for at (point, step)."""
        if self._kind(point, step) == "sigkill":
            os.kill(os.getpid(), signal.SIGKILL)

    def fail_worker_if_due(self, point: str, step: int | None, rank: int | None = None) -> None:
        """A worker phase, as it starts: raise or die if asked to at (point, step) on this rank."""
        kind = self._kind(point, step, rank)
        if kind == "raise":
            raise RuntimeError(f"injected fault in {point} at step {step} ({ENV})")
        if kind == "die":
            os._exit(1)
        if kind == "stall":
            time.sleep(STALL_S)

    def nan_due(self, point: str, step: int | None, rank: int | None = None) -> bool:
        """A worker phase, as it ends: whether to make its model's weights NaN on this rank."""
        return self._kind(point, step, rank) == "nan"

    def disk_error_due(self, point: str, step: int | None, rank: int | None = None) -> OSError | None:
        """A worker's checkpoint writer: the file system error to raise at its first write, or None."""
        kind = self._kind(point, step, rank)
        if kind not in DISK_ERRORS:
            return None
        code = DISK_ERRORS[kind]
        return OSError(code, f"{os.strerror(code)}, injected by {ENV}")

    def port_taken_due(self, restart: int) -> bool:
        """The SLURM wrapper's head node, in the job's run `restart` (0 the first): whether to take the
        port it chose for a server of its first `ray start` itself."""
        return self._kind("ray_start", restart) == "taken"

    def oom_due(self, point: str, step: int | None, rank: int | None = None) -> Fault | None:
        """A worker phase: the OOM to inject now on this rank (once per point and step), or None.
        Its `rank` says where it fires: None at the end of the attempt on every rank, a rank
        number inside the forward on that rank only (see the module's docstring)."""
        fault = self._fault(point, step, rank)
        if fault is None or fault.kind != "oom" or (point, step) in self.fired:
            return None
        self.fired.add((point, step))
        return fault
