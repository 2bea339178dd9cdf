"""Per-phase timing and peak memory, recorded under the phase's name.

    with measure("update_actor", metrics, device):
        ...
    # metrics["timing_s/update_actor"], metrics["perf/memory/update_actor/peak_gb"], ...

On CUDA the peak is torch's own: max_memory_allocated (live tensors) and max_memory_reserved
(what the caching allocator holds), reset at the start of each phase, with the rollout engine's
share taken apart. vLLM's weights and KV cache live in its CuMemAllocator pool, which torch's
allocator serves and counts; sleep unmaps the pool's pages but its tensors stay alive, so torch
still counts them, about gpu_memory_utilization x the device, in every phase. Per phase:
  trainer_peak_gb  max_memory_allocated less the pool's bytes: the trainer's own peak
  engine_pool_gb   the pool's bytes on the device in the phase: all of it while the engine is awake
                   (generate, or always without free_cache_engine), what is mapped at the phase's
                   start or end otherwise (the weights woken for update_weights), 0 while it sleeps
  peak_gb          their sum: the phase's peak on the device, the number the memory plan predicts
  reserved_gb      max_memory_reserved, the asleep pool taken out the same way
  device_used_gb   total - free from cudaMemGetInfo at the phase's end: what the driver sees,
                   including what torch never counts (CUDA context, NCCL and cuBLAS buffers)
The pool's bytes are its segments (cuMem allocations): a tensor inside them may leave a few MB of a
segment unused, so trainer_peak_gb can come out low by that much.

On CPU torch keeps no such counter, so the substitute is the process's resident set size (RSS),
sampled every few milliseconds by a background thread during the phase: `peak_gb` is the highest
RSS seen, `rss_start_gb` what it was when the phase began. It measures the whole process (Python,
libraries, the allocator's free lists, copies outside torch), so it is an upper bound on tensor
memory, and a spike shorter than the sampling interval can be missed. It is what an operator
watching the machine sees; issue 8's allocation tracker gives live tensor bytes for the planner.
"""

from __future__ import annotations

import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass

import psutil
import torch

GB = 1024**3
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


@contextmanager
def measure(phase: str, metrics: dict, device: torch.device | str = "cpu", memory_prefix: str = "perf/memory",
            engine_awake: bool = False):
    """Time `phase` and record its peak memory into `metrics` (see the module docstring) under
    `<memory_prefix>/<phase>/`: perf/memory/ holds a step's phases, the rows of the memory plan.
    `engine_awake`: the phase wakes the whole rollout engine (CUDA only; generate)."""
    device = torch.device(device)
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
        prefix = f"{memory_prefix}/{phase}"
        if sampler is None:
            torch.cuda.synchronize(device)
            free, total = torch.cuda.mem_get_info(device)
            cuda = cuda_memory_metrics(torch.cuda.max_memory_allocated(device), torch.cuda.max_memory_reserved(device),
                                       pool_start, engine_pool(), engine_awake, free, total)
            metrics.update({f"{prefix}/{key}": value for key, value in cuda.items()})
        else:
            metrics[f"{prefix}/peak_gb"] = sampler.finish() / GB
            metrics[f"{prefix}/rss_start_gb"] = sampler.start_rss / GB
        metrics[f"timing_s/{phase}"] = time.perf_counter() - start
