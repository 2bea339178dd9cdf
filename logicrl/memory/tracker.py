"""Peak live tensor bytes of a block of code: what the planner predicts, measured.

    with PeakTracker("cpu") as t:
        ...
    t.peak_bytes   # live tensor bytes at the highest point, tensors alive before the block included
    t.start_bytes  # live tensor bytes when the block began

CUDA: torch's `max_memory_allocated`, reset at the block's start. CPU: torch keeps no counter and the
RSS mixes in Python and the allocator's free lists, so the profiler's memory events are used: every
allocation and free in the block with the running total still live, added to the storages reachable
from Python at the start. Frees of storages that predate the block are left out, so the figure can
only overstate the peak (no trainer phase frees what it did not allocate); FSDP2's `storage.resize_`
goes through the same allocator and is counted.
"""

from __future__ import annotations

import gc
import os

import torch


def live_tensor_bytes(device_type: str = "cpu") -> int:
    """Bytes of every distinct tensor storage on `device_type` reachable from Python right now.

    Between phases every tensor the trainer holds (parameters, optimizer states, the engine's
    weights, the batch) is reachable from a Python object; only autograd's saved tensors are not,
    and none exist between phases.
    """
    from torch.utils._python_dispatch import is_traceable_wrapper_subclass

    if gc.get_freeze_count():
        # vLLM freezes the heap once its engine is built (vllm/utils/gc_utils.py freeze_gc_heap, for serving
        # latency), and gc.get_objects() leaves frozen objects out: the engine's weights and KV cache, and all
        # the trainer held by then, would be missing from the count. Unfrozen for good, not re-frozen: a
        # re-freeze would also pin whatever cyclic garbage the trainer makes later; the cost is a slower
        # collection over the engine's objects.
        gc.unfreeze()
    seen: dict[int, int] = {}
    for obj in gc.get_objects():
        # DTensor and other wrapper subclasses own no storage; their local tensors are found on their own.
        if not issubclass(type(obj), torch.Tensor) or is_traceable_wrapper_subclass(obj):
            continue
        if obj.device.type != device_type or obj.is_sparse:
            continue
        try:
            storage = obj.untyped_storage()
            ptr = storage.data_ptr()
        except RuntimeError:  # fake/functional tensors left by a compile trace own no memory
            continue
        if ptr:
            seen[ptr] = max(seen.get(ptr, 0), storage.nbytes())
    return sum(seen.values())


class PeakTracker:
    """Context manager measuring peak live tensor bytes on one device (module docstring)."""

    def __init__(self, device: torch.device | str = "cpu"):
        self.device = torch.device(device)
        self.start_bytes = self.peak_bytes = 0
        self._profiler = None

    def __enter__(self) -> PeakTracker:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.start_bytes = torch.cuda.memory_allocated(self.device)
            return self
        gc.collect()  # tensors kept alive only by reference cycles would otherwise count as live
        self.start_bytes = live_tensor_bytes("cpu")
        # c10 warns once per free of a block it has no size for (one that predates profiling),
        # and kineto logs its start and stop; neither says anything about the measurement.
        os.environ.setdefault("KINETO_LOG_LEVEL", "5")
        from torch.profiler import ProfilerActivity, profile

        self._profiler = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
        self._profiler.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.peak_bytes = torch.cuda.max_memory_allocated(self.device)
            return
        self._profiler.__exit__(*exc)
        self.peak_bytes = self.start_bytes + max(0, _max_running_total(self._profiler))
        self._profiler = None


def _max_running_total(prof) -> int:
    """Highest rise of the bytes the block allocated and has not yet freed (0 if nothing).

    Computed from the events' own sizes, in the order they happened, not from c10's process-wide
    running total: c10 keeps the sizes of blocks allocated under any earlier profiling session, and
    an entry whose block was freed while no profiler ran stays behind; a new block at the same
    address then "frees" the stale size inside the block and the running total drops by memory
    the block never held (seen as a 6 MB resize measured as 0 in a full test run). A free counts
    only for a block allocated inside this one, which is what the module docstring promises.
    """
    from torch._C._profiler import _EventType

    events, stack = [], list(prof.profiler.kineto_results.experimental_event_tree())
    while stack:
        event = stack.pop()
        if event.tag == _EventType.Allocation and event.extra_fields.device.type == "cpu":
            events.append(event)
        stack.extend(event.children)
    live: dict[int, int] = {}
    total = peak = 0
    for event in sorted(events, key=lambda e: (e.start_time_ns, e.extra_fields.id)):
        fields = event.extra_fields
        if fields.alloc_size > 0:
            live[fields.ptr] = live.get(fields.ptr, 0) + fields.alloc_size
            total += fields.alloc_size
            peak = max(peak, total)
        elif fields.ptr in live:
            total -= live.pop(fields.ptr)
    return peak
