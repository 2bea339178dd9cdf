"""Out-of-memory recovery: halve a phase's micro-batch (or token budget) and run the phase again.

    size = MicroSize("update_actor", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", 16)
    stats = retry_on_oom(size, attempt, device, reset=optimizer.zero_grad)   # attempt(size.value)

The worker's phase wrapper (workers/hybrid.py `run`) builds each phase's MicroSize from the step
plan and hands the phase this retry.

An attempt is all-or-nothing: the gradients of a failed attempt are dropped (`reset`) before the
retry, and the loss normaliser is fixed per mini-batch (algos/aggregation.py), so the retried
phase gives the same loss and gradient as an uninterrupted one, with nothing counted twice. The
halved value stays for the rest of the run (it is the rank's new setting) and is logged once.

Ranks agree on a retry with one all-reduce after each attempt. That works when every rank reaches
it: an OOM raised before or between collectives (the usual place: the allocation of a micro-batch's
activations or logits). A rank that fails inside a collective leaves the others waiting in it; the
process group's timeout then ends the run, and the last complete checkpoint is untouched.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import TypeVar

import torch
from tensordict import TensorDict

from logicrl.workers.fsdp import all_reduce_max
from logicrl.workers.micro import split_by_tokens, split_fixed

log = logging.getLogger("logicrl.workers")
T = TypeVar("T")


class OutOfMemoryAtMinimum(RuntimeError):
    """A phase ran out of memory with nothing left to halve."""


@dataclass
class MicroSize:
    phase: str  # the phase's name, as in timing_s/<phase>
    key: str  # the config key the value came from, for the message
    value: int  # rows per micro-batch, or tokens per micro-batch with a token budget
    by_tokens: bool = False  # value is a token budget (use_dynamic_bsz)
    minimum: int = 1  # below this halving means nothing (one row; a budget of one row's tokens)
    retries: int = 0

    def split(self, batch: TensorDict, device: torch.device, with_index: bool = False):
        """`batch` in micro-batches of `value` rows, or packed to `value` tokens (see workers/micro.py);
        with `with_index`, also the row order to undo (None for fixed splits, which keep it)."""
        if not self.by_tokens:
            parts = split_fixed(batch, self.value)
            return (parts, None) if with_index else parts
        # A row is never split: a budget below the longest row cannot make micro-batches smaller.
        self.minimum = int(batch["attention_mask"].sum(-1).max())
        return split_by_tokens(batch, self.value, device, with_index=with_index)

    def halve(self) -> None:
        if self.value <= self.minimum:
            raise OutOfMemoryAtMinimum(
                f"{self.phase} ran out of memory with {self.key}={self.value}, the smallest split there is: "
                f"lower data.max_response_length or rollout.n, turn on param_offload or gradient checkpointing, "
                f"or use more ranks; the last complete checkpoint is intact")
        old, self.value = self.value, max(self.minimum, self.value // 2)
        self.retries += 1
        log.warning(f"{self.phase} ran out of memory: {self.key} {old} -> {self.value} on this rank for the rest "
                    "of the run; the phase is re-run from its start")


def _release(device: torch.device) -> None:
    gc.collect()  # the failed attempt's activations are garbage now; free them before retrying
    if device.type == "cuda":
        torch.cuda.empty_cache()


def retry_on_oom(size: MicroSize, attempt: Callable[[int], T], device: torch.device,
                 reset: Callable[[], None] | None = None) -> T:
    """attempt(size.value), halving size.value and re-running after an OOM on any rank."""
    while True:
        result, failed = None, False
        try:
            result = attempt(size.value)
        except torch.OutOfMemoryError:
            failed = True
        if not all_reduce_max(int(failed), device):  # an OOM on any rank retries on all
            return result
        result = None
        if reset is not None:
            reset()
        _release(device)
        size.halve()


def phase_retry(size: MicroSize, device: torch.device, faults=None, step: int | None = None):
    """The retry a phase is handed by the worker's phase wrapper: `retry(attempt, reset=None)` runs
    retry_on_oom on the phase's size. A test-injected OOM (logicrl/faults.py) fires at the end of a
    successful attempt, so the retry must undo everything the attempt did."""

    def retry(attempt: Callable[[int], T], reset: Callable[[], None] | None = None) -> T:
        def guarded(value: int) -> T:
            result = attempt(value)
            if faults is not None and faults.oom_due(size.phase, step):
                raise torch.OutOfMemoryError(f"injected at {size.phase}:{step} (LOGICRL_INJECT_FAULT)")
            return result

        return retry_on_oom(size, guarded, device, reset)

    return retry
