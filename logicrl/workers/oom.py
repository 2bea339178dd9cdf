"""Out-of-memory recovery: halve a phase's micro-batch (or token budget) and run the phase again,
or, where the ranks cannot agree on that safely, end the run at once with the halved value saved.

    size = MicroSize("update_actor", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu", 16)
    stats = retry_on_oom(size, attempt, device, reset=optimizer.zero_grad, collectives=True)

An attempt is all-or-nothing: a failed attempt's gradients are dropped (`reset`) and the loss
normaliser is fixed per mini-batch, so the retry gives the result an uninterrupted phase would.
Ranks agree on a retry with one all-reduce after each attempt, which is safe only where the attempt
ran no collective (one rank; the hf engine's generate). In a phase of an FSDP2 model on several
ranks the failing rank's all-reduce would meet the others' all-gather (collectives pair by order,
not kind): a hang or corrupt data. So it raises RankOutOfMemory at once, touching no collective, and
the run ends with the halved value saved for the re-run (exit 4). docs/faults.md explains the rest.
`is_oom` also takes the plain RuntimeError that cuBLAS, NCCL and vLLM's memory pool raise.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Callable
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from typing import TypeVar

import torch
from tensordict import TensorDict

from logicrl.workers.fsdp import all_reduce_max
from logicrl.workers.micro import split_by_tokens, split_fixed

log = logging.getLogger("logicrl.workers")
T = TypeVar("T")
# What CUDA's libraries put in a RuntimeError when an allocation of theirs fails (lower case).
OOM_MESSAGES = ("out of memory", "cublas_status_alloc_failed", "cudnn_status_alloc_failed")


class OutOfMemoryAtMinimum(RuntimeError):
    """A phase ran out of memory with nothing left to halve."""


class RankOutOfMemory(RuntimeError):
    """This rank ran out of memory inside a phase whose attempts run collectives with the other
    ranks: the run must end; `value` is the halved micro-batch (or token budget) to resume with."""

    def __init__(self, phase: str, key: str, old: int, value: int):
        self.phase, self.key, self.old, self.value = phase, key, old, value
        super().__init__(f"{phase} ran out of memory inside FSDP2's collectives with {key}={old}; "
                         f"resume with {key}={value}")

    def __reduce__(self):  # Ray pickles it to the driver; the default would call cls(message)
        return type(self), (self.phase, self.key, self.old, self.value)


def is_oom(err: BaseException) -> bool:
    """torch.OutOfMemoryError, or a RuntimeError that CUDA's libraries raise for a failed allocation."""
    if isinstance(err, torch.OutOfMemoryError):
        return True
    return isinstance(err, RuntimeError) and any(m in str(err).lower() for m in OOM_MESSAGES)


@dataclass
class MicroSize:
    phase: str  # the phase's name, as in timing_s/<phase>
    key: str  # the config key the value came from, for the message
    value: int  # rows per micro-batch, or tokens per micro-batch with a token budget
    by_tokens: bool = False  # value is a token budget (use_dynamic_bsz)
    minimum: int = 1  # below this halving means nothing (one row; a budget of one row's tokens)
    retries: int = 0
    # Ranks that split each packed row (Ulysses SP, models/ulysses.py): a group's micro-batch packs
    # group x value tokens, of which each rank computes its 1/group share, so `value` (what is reported,
    # halved and saved) stays the config's per-rank budget. Rows per micro-batch are not scaled.
    group: int = 1

    def split(self, batch: TensorDict, device: torch.device, with_index: bool = False):
        """`batch` in micro-batches of `value` rows, or packed to `value` tokens per rank (see workers/micro.py);
        with `with_index`, also the row order to undo (None for fixed splits, which keep it)."""
        if not self.by_tokens:
            parts = split_fixed(batch, self.value)
            return (parts, None) if with_index else parts
        # A row is never split: a budget below the longest row's share cannot make micro-batches smaller.
        self.minimum = -(-int(batch["attention_mask"].sum(-1).max()) // self.group)
        return split_by_tokens(batch, self.value * self.group, device, with_index=with_index)

    def halve(self) -> int:
        """Halve `value` (returns the old one), or raise OutOfMemoryAtMinimum."""
        if self.value <= self.minimum:
            raise OutOfMemoryAtMinimum(
                f"{self.phase} ran out of memory with {self.key}={self.value}, the smallest split there is: "
                f"lower data.max_response_length or rollout.n, turn on param_offload or gradient checkpointing, "
                f"or use more ranks; the last complete checkpoint is intact")
        old, self.value = self.value, max(self.minimum, self.value // 2)
        self.retries += 1
        return old


def _release(device: torch.device) -> None:
    gc.collect()  # the failed attempt's activations are garbage now; free them before retrying
    if device.type == "cuda":
        torch.cuda.empty_cache()


def _multi_rank() -> bool:
    return torch.distributed.is_initialized() and torch.distributed.get_world_size() > 1


def retry_on_oom(size: MicroSize, attempt: Callable[[MicroSize], T], device: torch.device,
                 reset: Callable[[], None] | None = None, collectives: bool = False,
                 injected_oom: Callable[[], bool] | None = None) -> T:
    """attempt(size), halving size.value and re-running after an OOM on any rank; with
    `collectives` on several ranks, an OOM inside the attempt raises RankOutOfMemory instead.
    The attempt is handed the size itself, not its value, so it splits as the size says (rows, or
    packed to a token budget) with whatever value this try has.
    `injected_oom()`, asked once an attempt has returned, says whether a test's OOM fires there."""
    while True:
        result, failed = None, False
        try:
            result = attempt(size)
        except RuntimeError as err:  # torch.OutOfMemoryError is one
            if not is_oom(err):
                raise
            if collectives and _multi_rank():
                # No agreement: the other ranks may be inside a collective (see the docstring).
                old = size.halve()
                raise RankOutOfMemory(size.phase, size.key, old, size.value) from err
            failed = True
        else:
            failed = injected_oom is not None and injected_oom()
        if not all_reduce_max(int(failed), device):  # an OOM on any rank retries on all
            return result
        result = None
        if reset is not None:
            reset()
        _release(device)
        old = size.halve()
        log.warning(f"{size.phase} ran out of memory: {size.key} {old} -> {size.value} on this rank for the rest "
                    "of the run; the phase is re-run from its start")


@contextmanager
def _oom_in_first_layer(model: torch.nn.Module, message: str):
    """Raise torch.OutOfMemoryError once, after the forward of `model`'s first FSDP2 unit below
    the root (the first decoder layer, workers/fsdp.py `shard_model`): mid-forward, where the other
    ranks go on into the next layer's all-gather."""
    from torch.distributed.fsdp import FSDPModule

    units = [m for m in model.modules() if isinstance(m, FSDPModule)]  # the root comes first
    layer = units[1] if len(units) > 1 else model

    def hook(module, args, output):
        handle.remove()
        raise torch.OutOfMemoryError(message)

    handle = layer.register_forward_hook(hook)
    try:
        yield
    finally:
        handle.remove()


def phase_retry(size: MicroSize, device: torch.device, faults=None, step: int | None = None,
                rank: int | None = None, sharded: torch.nn.Module | None = None):
    """The retry a phase is handed by the worker's phase wrapper: `retry(attempt, reset=None)` runs
    retry_on_oom on the phase's size, handing `attempt` that size. `sharded` is the FSDP2 model the
    phase runs, None for a phase without collectives. A test-injected OOM (logicrl/faults.py) fires at the
    end of a successful attempt on every rank, so the retry must undo everything the attempt did; or, aimed
    at one rank, inside `sharded`'s forward on that rank."""

    def retry(attempt: Callable[[MicroSize], T], reset: Callable[[], None] | None = None) -> T:
        fault = faults.oom_due(size.phase, step, rank) if faults is not None else None
        message = f"injected at {size.phase}:{step} (LOGICRL_INJECT_FAULT)"
        mid_forward = fault is not None and fault.rank is not None and sharded is not None
        armed = [fault is not None and not mid_forward]  # at the end of the first attempt only

        def injected() -> bool:
            fire, armed[0] = armed[0], False
            return fire

        with _oom_in_first_layer(sharded, message) if mid_forward else nullcontext():
            return retry_on_oom(size, attempt, device, reset, collectives=sharded is not None, injected_oom=injected)

    return retry
