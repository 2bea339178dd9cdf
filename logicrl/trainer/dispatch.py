"""Sending a phase to the ranks and taking back what they computed: the controller's side of `run`.

`start` cuts the batch into one shard per rank (per sequence-parallel group, which shares its rows) and
issues the phase without waiting; `finish` waits for the ranks, adds what they return to the batch and
their metrics to the step's `StepState` (trainer/step_state.py), and times the phase as the controller
saw it (`timing_s/<phase>`, the Ray transfers included). `run` is the two back to back; a step that
overlaps phases keeps the handle and finishes it where it needs the result.
"""

from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from omegaconf import DictConfig
from tensordict import TensorDict

from logicrl.config.phases import phase as phase_row
from logicrl.config.plan import StepPlan
from logicrl.config.sequence_parallel import phase_sp_size
from logicrl.faults import Faults
from logicrl.trainer.batch import group_shards
from logicrl.trainer.micro_sizes import ended_by_oom
from logicrl.trainer.step_state import StepState
from logicrl.workers.oom import RankOutOfMemory


@contextmanager
def timed(faults: Faults, phase: str, state: StepState):
    """`timing_s/<phase>` of a phase the controller runs itself (reward, advantages)."""
    faults.kill_if_due(phase, state.step)  # crash tests' fault injection; a no-op unless asked
    start = time.perf_counter()
    yield
    add_time(state, phase, time.perf_counter() - start)


def add_time(state: StepState, phase: str, seconds: float) -> None:
    # Summed: dynamic sampling's rounds run generate and reward more than once a step.
    state.metrics[f"timing_s/{phase}"] = state.metrics.get(f"timing_s/{phase}", 0.0) + seconds


@dataclass
class Issued:
    """A phase sent to the ranks and not yet waited for."""

    phase: str
    batch: TensorDict | None  # where the ranks' outputs go (None: the phase takes no rows)
    call: object  # the group's handle (controller/pending.py Pending)
    started: float  # perf_counter when the controller began the phase, for timing_s/<phase>
    ranks_per_group: int  # ranks that return the same rows (Ulysses SP): one of each group's is kept


class PhaseDispatch:
    def __init__(self, workers, cfg: DictConfig, plan: StepPlan, faults: Faults, ckpt_root: Path):
        self.workers, self.cfg, self.plan, self.faults, self.ckpt_root = workers, cfg, plan, faults, ckpt_root

    def ranks_of(self, phase: str) -> int:
        """How many ranks run `phase`: the generating ranks for the engine's phase, the training ranks else."""
        return self.plan.generating_ranks if phase_row(phase).model == "engine" else self.plan.training_ranks

    def ranks_per_group(self, phase: str) -> int:
        """Ranks per SP group for `phase`: its model's; generation is every rank's own (rollout is unchanged by SP)."""
        return phase_sp_size(self.cfg, phase)

    def rank_shards(self, phase: str, batch: TensorDict, keep: tuple[str, ...]) -> list[TensorDict]:
        """One shard per rank; with Ulysses SP of size S (models/ulysses.py) the batch splits into
        ranks / S shards, each sent to the S consecutive ranks of one group, which split its sequences."""
        return group_shards(batch, self.ranks_of(phase), self.ranks_per_group(phase), keep)

    def start(self, phase: str, batch: TensorDict | None, state: StepState, keep: tuple[str, ...] = (),
              **kwargs) -> Issued:
        """Issue a worker phase on every rank's shard of `batch` (padded to equal shards) without waiting.
        `keep`: the rows' text fields the phase needs (trainer/batch.py tensors)."""
        self.faults.kill_if_due(phase, state.step)  # crash tests' fault injection; a no-op unless asked
        started = time.perf_counter()
        if batch is None:
            call = self.workers.call_async("run", None, phase=phase, step=state.step, **kwargs)
        else:
            call = self.workers.dispatch_async("run", self.rank_shards(phase, batch, keep), phase=phase,
                                               step=state.step, **kwargs)
        return Issued(phase, batch, call, started, self.ranks_per_group(phase))

    def finish(self, issued: Issued, state: StepState) -> None:
        """Wait for an issued phase: what the ranks return goes into its batch, their metrics into `state`."""
        try:
            outs = issued.call.result()
        except RuntimeError as err:
            # A rank's RankOutOfMemory, as the group's WorkerFailed (controller/worker_group.py;
            # not imported: it imports Ray). The other ranks may be stuck in a collective: fit's
            # shutdown kills them.
            if isinstance(getattr(err, "cause", None), RankOutOfMemory):
                raise ended_by_oom(self.ckpt_root, err) from err
            raise
        # With SP a group's ranks return the same rows: the first of each group's (metrics from all).
        parts = [out for out, _ in outs[::issued.ranks_per_group] if out is not None]
        if parts:
            issued.batch.update(torch.cat(parts)[:len(issued.batch)])
        state.add_rank_metrics([m for _, m in outs])
        add_time(state, issued.phase, time.perf_counter() - issued.started)

    def run(self, phase: str, batch: TensorDict | None, state: StepState, keep: tuple[str, ...] = (),
            **kwargs) -> None:
        """Run a worker phase and add what it computed to `batch` (`start`, then `finish`)."""
        self.finish(self.start(phase, batch, state, keep, **kwargs), state)
