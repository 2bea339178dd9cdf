"""Phases declared on a worker class, and the one wrapper that runs them.

`@worker_phase(name, retried=...)` marks a method as the phase `name` of config/phases.py by an attribute
on the function (verl's `@register` does the same), so each class that derives from `PhaseWorker` collects
its own phases when it is defined: a rollout-only and a trainer-only worker declare theirs without touching
the colocated worker's. `run(batch, phase, step)` reads only the declarations: it times the phase, measures
its memory (`perf/memory/<phase>/...`), hands it its OOM retry (workers/oom.py) with the phase's micro-batch
(halved by an OOM for the rest of the run), reshards after a forward without a backward, and fires
test-injected faults (logicrl/faults.py).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from types import MappingProxyType

import torch
from tensordict import TensorDict

from logicrl.config.phases import phase as phase_row
from logicrl.memory.telemetry import measure, tracks_tensors
from logicrl.workers.fsdp import reshard
from logicrl.workers.oom import phase_retry

DECLARATION = "__worker_phase__"  # the attribute @worker_phase sets on the method


@dataclass(frozen=True)
class WorkerPhase:
    """What `PhaseWorker.run` needs to run one phase: its method, and the rest from config/phases.py."""

    name: str  # a row of config/phases.py that runs on a worker
    method: Callable  # (worker, batch on the rank's device or None, retry or None, **kwargs) -> (out, metrics)
    # An OOM halves the phase's micro-batch (its row's rows_key, or budget_key with use_dynamic_bsz, as
    # the step plan set it) and re-runs it: the method's `retry` hands each attempt that MicroSize.
    retried: bool

    @property
    def model(self) -> str:
        """The model it runs: "actor", "ref", "critic", "reward_model" (FSDP2) or "engine" (its own copy)."""
        return phase_row(self.name).model

    @property
    def resharded(self) -> bool:
        """A forward without a backward leaves FSDP2's root unit gathered (workers/fsdp.py reshard):
        `run` reshards after it, so that between phases every FSDP2 model holds only its shards."""
        return phase_row(self.name).forward_only


def worker_phase(name: str, *, retried: bool):
    """Declare the method below as the phase `name` of the class it is defined in (config/phases.py
    must give it a model)."""
    if not phase_row(name).on_worker:
        raise ValueError(f"{name} runs on the controller (config/phases.py gives it no model), not on a worker")

    def declare(method: Callable) -> Callable:
        setattr(method, DECLARATION, WorkerPhase(name, method, retried))
        return method

    return declare


def declared_in(cls: type) -> dict[str, WorkerPhase]:
    """The phases declared on `cls` and its bases; a subclass's declaration of a name replaces its base's."""
    found: dict[str, WorkerPhase] = {}
    for klass in reversed(cls.__mro__):
        own: dict[str, str] = {}
        for attr, value in vars(klass).items():
            declared = getattr(value, DECLARATION, None)
            if declared is None:
                continue
            if declared.name in own:
                raise ValueError(f"{klass.__name__} declares phase {declared.name!r} twice: on {own[declared.name]} "
                                 f"and {attr}")
            own[declared.name] = attr
            found[declared.name] = declared
    return found


@torch.no_grad()
def poison(model: torch.nn.Module) -> None:
    """Fill this rank's shard of the model's first trainable parameter with NaN (the `nan` test fault)."""
    param = next(p for p in model.parameters() if p.requires_grad)
    (param.to_local() if hasattr(param, "to_local") else param).fill_(float("nan"))


class PhaseWorker:
    """A rank that runs declared phases. A subclass sets `faults`, `rank`, `device` and `sizes` (each
    retried phase's MicroSize), and says which FSDP2 module a phase's model is (`module`)."""

    track_tensor_peaks = True  # trainer.track_tensor_peaks: CPU phases of tracked steps measure live tensors

    phases: Mapping[str, WorkerPhase] = MappingProxyType({})  # this class's own, set when it is defined
    # Phases a subclass does not run although a base declares them (a trainer-only rank has no generate).
    without_phases: tuple[str, ...] = ()

    def __init_subclass__(cls, **kwargs):
        super().__init_subclass__(**kwargs)
        cls.phases = MappingProxyType({name: p for name, p in declared_in(cls).items()
                                       if name not in cls.without_phases})

    def module(self, model: str) -> torch.nn.Module | None:
        """The FSDP2 module behind a phase's `model`; None where the phase runs no collectives (the engine)."""
        raise NotImplementedError

    def run(self, batch: TensorDict | None, phase: str, step: int | None = None,
            **kwargs) -> tuple[TensorDict | None, dict]:
        """Run one phase on this rank's shard; `step` labels test faults (None: none fire). A phase takes
        the rank's TensorDict shard (None for update_weights) and returns `(what it adds or None, metrics)`;
        tensors cross the Ray boundary on CPU and `run` moves them to the rank's device and back."""
        declared = self.phases.get(phase)
        if declared is None:
            raise ValueError(f"no worker phase {phase!r} on {type(self).__name__}; it runs {', '.join(self.phases)}")
        self.faults.fail_worker_if_due(phase, step, self.rank)  # test-injected failures; a no-op unless asked
        metrics: dict = {}
        model = self.module(declared.model)
        size = self.sizes[phase] if declared.retried else None
        # Only generate wakes the whole engine; other phases see it asleep (or only its weights, for the sync).
        tracked = self.track_tensor_peaks and tracks_tensors(step)
        with measure(phase, metrics, self.device, engine_awake=phase == "generate", track_tensors=tracked):
            # The sharded model tells the retry that the phase runs FSDP2 collectives: there an OOM
            # on several ranks ends the run instead of retrying in place (workers/oom.py).
            retry = None if size is None else phase_retry(size, self.device, self.faults, step, self.rank, model)
            out, phase_metrics = declared.method(self, None if batch is None else batch.to(self.device), retry,
                                                 **kwargs)
            if declared.resharded:
                reshard(model)
        if model is not None and self.faults.nan_due(phase, step, self.rank):
            poison(model)  # test-injected: weights gone NaN, as a diverged update would leave them
        metrics.update(phase_metrics)
        if size is not None:  # the micro-batch as it stands, and how often an OOM halved it (0 normally)
            metrics[f"perf/oom_retries/{phase}"] = size.retries
            metrics[f"perf/micro_size/{phase}"] = size.value
        return (None if out is None else out.cpu()), metrics
