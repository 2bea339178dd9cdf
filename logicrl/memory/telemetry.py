"""Per-phase timing and peak memory, recorded under the phase's name.

    with measure("update_actor", metrics, device):
        ...
    # metrics["timing_s/update_actor"], metrics["perf/memory/update_actor/peak_gb"], ...

On CUDA the peak is torch's own: max_memory_allocated (live tensors) and max_memory_reserved
(what the caching allocator holds), reset at the start of each phase.

On CPU torch keeps no such counter, so the substitute is the process's resident set size (RSS),
sampled every few milliseconds by a background thread during the phase: `peak_gb` is the highest
RSS seen, `rss_start_gb` what it was when the phase began. It measures the whole process (Python,
libraries, the allocator's free lists, copies outside torch), so it is an upper bound on tensor
memory, and a spike shorter than the sampling interval can be missed. It is what an operator
watching the machine sees; issue 8's allocation tracker gives live tensor bytes for the planner.
"""

from __future__ import annotations

import threading
import time
from contextlib import contextmanager

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


@contextmanager
def measure(phase: str, metrics: dict, device: torch.device | str = "cpu", memory_prefix: str = "perf/memory"):
    """Time `phase` and record its peak memory into `metrics` (see the module docstring) under
    `<memory_prefix>/<phase>/`: perf/memory/ holds a step's phases, the rows of the memory plan."""
    device = torch.device(device)
    start = time.perf_counter()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
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
            metrics[f"{prefix}/peak_gb"] = torch.cuda.max_memory_allocated(device) / GB
            metrics[f"{prefix}/reserved_gb"] = torch.cuda.max_memory_reserved(device) / GB
        else:
            metrics[f"{prefix}/peak_gb"] = sampler.finish() / GB
            metrics[f"{prefix}/rss_start_gb"] = sampler.start_rss / GB
        metrics[f"timing_s/{phase}"] = time.perf_counter() - start
