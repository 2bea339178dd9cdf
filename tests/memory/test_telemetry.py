"""Per-phase memory metrics: on CUDA the sleeping engine's pool is taken out of the trainer's peak.

The CUDA calls and vLLM's allocator are stood in for here, with round GiB figures so each expected
value is read off by hand; tests/memory/test_telemetry_gpu.py checks the same on a real device.
"""

import sys
from types import ModuleType, SimpleNamespace

import pytest
import torch

from logicrl.memory.telemetry import (
    GB,
    Pool,
    cuda_memory_metrics,
    engine_pool,
    measure,
    tracks_tensors,
)
from logicrl.memory.tracker import live_tensor_bytes

MB = 1024**2

WEIGHTS, KV = 2 * GB, 6 * GB  # the engine's pool: weights (backed up on sleep) and KV cache


def test_an_asleep_engine_is_not_charged_to_a_training_phase():
    # update_actor: pool asleep from start to end; torch still counts its 8 GiB in the peak.
    asleep = Pool(total=WEIGHTS + KV, mapped=0)
    got = cuda_memory_metrics(max_allocated=19 * GB, max_reserved=20 * GB, start=asleep, end=asleep,
                              engine_awake=False, free=60 * GB, total=80 * GB)
    assert got == {"trainer_peak_gb": 11.0, "engine_pool_gb": 0.0, "peak_gb": 11.0, "reserved_gb": 12.0,
                   "device_used_gb": 20.0}


def test_generate_charges_the_whole_pool_and_the_sync_the_woken_weights():
    asleep, weights_up = Pool(WEIGHTS + KV, 0), Pool(WEIGHTS + KV, WEIGHTS)
    # generate starts with the synced weights mapped and ends asleep; in between it woke everything.
    gen = cuda_memory_metrics(12 * GB, 13 * GB, weights_up, asleep, engine_awake=True, free=70 * GB, total=80 * GB)
    assert (gen["trainer_peak_gb"], gen["engine_pool_gb"], gen["peak_gb"]) == (4.0, 8.0, 12.0)
    # update_weights: asleep at the start, weights woken by the end (the KV cache stays asleep).
    sync = cuda_memory_metrics(10.5 * GB, 11 * GB, asleep, weights_up, engine_awake=False, free=0, total=80 * GB)
    assert (sync["trainer_peak_gb"], sync["engine_pool_gb"], sync["peak_gb"], sync["reserved_gb"]) == \
        (2.5, 2.0, 4.5, 5.0)


def test_without_an_engine_pool_the_peaks_are_torchs():
    got = cuda_memory_metrics(3 * GB, 4 * GB, Pool(), Pool(), engine_awake=True, free=70 * GB, total=80 * GB)
    assert (got["trainer_peak_gb"], got["engine_pool_gb"], got["peak_gb"], got["reserved_gb"]) == (3.0, 0.0, 3.0, 4.0)


def fake_vllm_pool(monkeypatch, allocations: list[tuple[int, bool]]) -> SimpleNamespace:
    """vLLM's CuMemAllocator singleton as telemetry reads it: pointer_to_data of (size, asleep)."""
    instance = SimpleNamespace(pointer_to_data={
        address: SimpleNamespace(handle=(0, size, address, []), is_asleep=asleep)
        for address, (size, asleep) in enumerate(allocations)})
    module = ModuleType("vllm.device_allocator.cumem")
    module.CuMemAllocator = SimpleNamespace(instance=instance)
    monkeypatch.setitem(sys.modules, "vllm.device_allocator.cumem", module)
    return instance


def test_the_pool_is_read_from_vllms_allocator_only_when_vllm_made_one(monkeypatch):
    monkeypatch.delitem(sys.modules, "vllm.device_allocator.cumem", raising=False)
    assert engine_pool() == Pool()
    fake_vllm_pool(monkeypatch, [(WEIGHTS, False), (KV, True)])
    assert engine_pool() == Pool(total=WEIGHTS + KV, mapped=WEIGHTS)


def test_measure_on_cuda_records_both_shares(monkeypatch):
    pool = fake_vllm_pool(monkeypatch, [(WEIGHTS, True), (KV, True)])
    calls = []
    monkeypatch.setattr(torch.cuda, "synchronize", lambda device=None: calls.append("sync"))
    monkeypatch.setattr(torch.cuda, "reset_peak_memory_stats", lambda device=None: calls.append("reset"))
    monkeypatch.setattr(torch.cuda, "max_memory_allocated", lambda device=None: 14 * GB)
    monkeypatch.setattr(torch.cuda, "max_memory_reserved", lambda device=None: 15 * GB)
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (64 * GB, 80 * GB))
    metrics = {}
    with measure("update_weights", metrics, "cuda:0"):
        for data in pool.pointer_to_data.values():  # the sync wakes the weights only
            data.is_asleep = data.handle[1] == KV
    prefix = "perf/memory/update_weights"
    assert calls == ["sync", "reset", "sync"]
    assert metrics[f"{prefix}/trainer_peak_gb"] == 6.0 and metrics[f"{prefix}/engine_pool_gb"] == 2.0
    assert metrics[f"{prefix}/peak_gb"] == 8.0 and metrics[f"{prefix}/reserved_gb"] == 9.0
    assert metrics[f"{prefix}/device_used_gb"] == 16.0 and metrics["timing_s/update_weights"] >= 0


def test_the_cpu_path_keeps_its_metrics():
    metrics = {}
    with measure("ref", metrics, "cpu"):
        torch.ones(1024)
    # RSS under names that say so: not peak_gb, which is what the plan predicts on CUDA.
    assert set(metrics) == {"perf/memory/ref/rss_peak_gb", "perf/memory/ref/rss_start_gb", "timing_s/ref"}
    assert metrics["perf/memory/ref/rss_peak_gb"] >= metrics["perf/memory/ref/rss_start_gb"] > 0


def test_a_tracked_cpu_phase_reports_its_live_tensor_peak():
    metrics = {}
    before = live_tensor_bytes("cpu")
    with measure("ref", metrics, "cpu", track_tensors=True):
        x = torch.ones(1 << 20)  # 4 MiB of fp32, freed before the phase ends
        del x
    # The peak is what was live at the start plus the 4 MiB (a few bytes of the profiler's own aside).
    assert metrics["perf/memory/ref/tensor_peak_gb"] * GB - before == pytest.approx(4 * MB, abs=64 * 1024)
    assert metrics["perf/memory/ref/rss_peak_gb"] > metrics["perf/memory/ref/tensor_peak_gb"]


def test_which_steps_track_tensors():
    assert [s for s in range(1, 31) if tracks_tensors(s)] == [1, 10, 20, 30]
    assert not tracks_tensors(None)  # a worker phase called outside the step loop (tests, benchmarks)
