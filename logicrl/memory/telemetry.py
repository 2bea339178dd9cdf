"""Per-phase timing and peak memory, recorded under the phase's name.

    with measure("update_actor", metrics, device):
        ...
    # metrics["timing_s/update_actor"], metrics["perf/memory/update_actor/peak_gb"], ...

On CUDA the peak is torch's own counter, reset at each phase's start, with the rollout engine's pool
taken apart: vLLM's CuMemAllocator pool stays counted by torch while it sleeps, so each phase reports
the trainer's own peak, the pool's mapped bytes and their sum (`peak_gb`, what the plan predicts).
On CPU torch keeps no counter: `rss_peak_gb` is the process's RSS sampled by a background thread, an
upper bound on tensor memory (Python, libraries, the allocator's free lists), and on the steps that
track it `tensor_peak_gb` is the phase's peak of live tensor bytes (memory/tracker.py, what
benchmarks/memory_plan.py compares with the plan). On CUDA `tensor_peak_gb` is `peak_gb`. Every key
and its meaning: docs/memory.md ("Measured in a run").
"""

from __future__ import annotations

import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass

import psutil
import torch

from logicrl.memory.phases import GB

SAMPLE_S = 0.005


class _RSSSampler(threading.Thread):
    def __init__(self):
        super().__init__(daemon=True)
        self.process = psutil.Process()
        self.start_rss = self.peak = self.process.memory_info().rss
        self._done = threading.Event()

    def run(self):
        while not self._done.wait(SAMPLE_S):
            self.peak = max(self.peak, self.process.memory_info().rss)

    def finish(self) -> int:
        self._done.set()
        self.join()
        return max(self.peak, self.process.memory_info().rss)


@dataclass(frozen=True)
class Pool:
    """vLLM's CuMemAllocator pool at one moment: all its bytes, and those mapped (awake)."""

    total: int = 0
    mapped: int = 0


def engine_pool() -> Pool:
    """The pool of this process's vLLM engine (the allocator is a per-process singleton); empty
    without one. vLLM is never imported here: a process that did not import it has no pool."""
    cumem = sys.modules.get("vllm.device_allocator.cumem")
    allocator = getattr(getattr(cumem, "CuMemAllocator", None), "instance", None)
    if allocator is None:
        return Pool()
    # handle = (device, size, address, chunks); is_asleep: sleep() unmapped it.
    data = list(allocator.pointer_to_data.values())
    return Pool(sum(d.handle[1] for d in data), sum(d.handle[1] for d in data if not d.is_asleep))


def cuda_memory_metrics(max_allocated: int, max_reserved: int, start: Pool, end: Pool, engine_awake: bool,
                        free: int, total: int) -> dict[str, float]:
    """The CUDA metrics of one phase (module docstring), from torch's peaks, the pool at the
    phase's start and end, and cudaMemGetInfo at its end; bytes in, GB out."""
    pool = max(start.total, end.total)  # counted by torch all phase long (its tensors live on)
    engine = pool if engine_awake else max(start.mapped, end.mapped)
    trainer = max_allocated - pool
    return {"trainer_peak_gb": trainer / GB, "engine_pool_gb": engine / GB, "peak_gb": (trainer + engine) / GB,
            "reserved_gb": (max_reserved - pool + engine) / GB, "device_used_gb": (total - free) / GB}


TENSOR_EVERY = 10


def tracks_tensors(step: int | None) -> bool:
    """Whether a CPU phase of `step` measures its live tensor peak: the first step (the plan checked
    before a long run goes on) and every TENSOR_EVERY-th (responses grow). Not every step: the tracker scans
    every Python object at the phase's start and the profiler records every op, which about doubled the tiny
    model's update_actor (1.0-1.3 s on tracked steps, 0.45-0.5 s on the others: one 2-rank run of the
    default on shared cores); the ops' share stays in that step's timing_s. Steps 2 and 3 were tracked too
    once: every short run (the integration tests' 2-3 steps) then paid it on each step."""
    return step is not None and (step == 1 or step % TENSOR_EVERY == 0)


@contextmanager
def measure(phase: str, metrics: dict, device: torch.device | str = "cpu", memory_prefix: str = "perf/memory",
            engine_awake: bool = False, track_tensors: bool = False):
    """Time `phase` and record its peak memory into `metrics` (see the module docstring) under
    `<memory_prefix>/<phase>/`: perf/memory/ holds a step's phases, the rows of the memory plan.
    `engine_awake`: the phase wakes the whole rollout engine (CUDA only; generate). `track_tensors`: on
    CPU, also measure the live tensor peak (tensor_peak_gb; CUDA's counter is free and always read)."""
    device = torch.device(device)
    tracker = None
    if device.type != "cuda" and track_tensors:
        from logicrl.memory.tracker import PeakTracker

        # Its start (a scan of every Python object) and its end (the allocation records read) stay out of
        # the phase's time.
        tracker = PeakTracker("cpu").__enter__()
    start = time.perf_counter()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        pool_start = engine_pool()
        sampler = None
    else:
        sampler = _RSSSampler()
        sampler.start()
    try:
        yield
    finally:
        elapsed = time.perf_counter() - start
        prefix = f"{memory_prefix}/{phase}"
        if sampler is None:
            torch.cuda.synchronize(device)
            free, total = torch.cuda.mem_get_info(device)
            cuda = cuda_memory_metrics(torch.cuda.max_memory_allocated(device), torch.cuda.max_memory_reserved(device),
                                       pool_start, engine_pool(), engine_awake, free, total)
            metrics.update({f"{prefix}/{key}": value for key, value in cuda.items()})
            metrics[f"{prefix}/tensor_peak_gb"] = cuda["peak_gb"]
        else:
            if tracker is not None:
                tracker.__exit__(None, None, None)
                metrics[f"{prefix}/tensor_peak_gb"] = tracker.peak_bytes / GB
            metrics[f"{prefix}/rss_peak_gb"] = sampler.finish() / GB  # not peak_gb: not what the plan predicts
            metrics[f"{prefix}/rss_start_gb"] = sampler.start_rss / GB
        metrics[f"timing_s/{phase}"] = elapsed
