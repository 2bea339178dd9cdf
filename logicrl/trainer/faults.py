"""Deterministic fault injection, for the tests that prove crash-safety and OOM recovery.

    LOGICRL_INJECT_FAULT="sigkill@update_actor:3"      the process SIGKILLs itself in step 3's update_actor
    LOGICRL_INJECT_FAULT="sigkill@save:4,oom@gen:2"    several, comma-separated
    LOGICRL_INJECT_FAULT="sigkill@update_actor:2#2"    only in curriculum stage 2 (1-based)

A fault is `kind@point:step[#stage]`. Points are the phases' names plus `save` (after the ranks wrote a
checkpoint, before it is committed). Kinds: `sigkill` (the controller dies like a killed job: no
cleanup, no atexit) and `oom` (raises torch.OutOfMemoryError, what a CUDA OOM raises). Unset, this
is one dict lookup per phase. A real SIGKILL at a random time is what users see; a fixed point
makes the test reproducible and lets it hit the narrow windows (mid-save) on purpose.
"""

from __future__ import annotations

import os
import signal

import torch

ENV = "LOGICRL_INJECT_FAULT"


def _parse(spec: str) -> dict[tuple[str, int, int | None], str]:
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
        if kind not in ("sigkill", "oom"):
            raise ValueError(f"{ENV}: unknown fault kind {kind!r} in {item!r}: use sigkill or oom")
    return faults


_fired: set[tuple[str, int]] = set()


def maybe_fail(point: str, step: int, stage: int | None = None, kinds: tuple[str, ...] = ("sigkill", "oom")) -> None:
    """`stage` is the 0-based curriculum stage (None outside a curriculum). `kinds` are the faults
    this call site can raise: the controller kills (a crashed job), the workers run out of memory.

    An `oom` fires once per (point, step) in a process, as a transient OOM would: the phase's
    retry with a smaller micro-batch then goes through. On a worker, `step` is the phase's call
    count on that rank (1 for its first call), which is the training step for once-a-step phases.
    """
    spec = os.environ.get(ENV)
    if not spec:
        return
    faults = _parse(spec)
    kind = faults.get((point, step, None))
    if kind is None and stage is not None:
        kind = faults.get((point, step, stage + 1))
    if kind not in kinds:
        return
    if kind == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    elif kind == "oom" and (point, step) not in _fired:
        _fired.add((point, step))
        raise torch.OutOfMemoryError(f"injected by {ENV} at {point}:{step}")
