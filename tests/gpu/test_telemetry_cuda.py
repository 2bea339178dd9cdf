"""Telemetry on a real GPU: torch counts a memory pool's tensors in max_memory_allocated, so the
pool's bytes must come out of the trainer's peak (logicrl/memory/telemetry.py).

The first test stands a plain torch MemPool in for vLLM's (the GPU check machine has no vLLM); the
second uses vLLM's own CuMemAllocator and sleep, where vLLM is installed.
"""

import sys
from types import ModuleType, SimpleNamespace

import pytest
import torch

from logicrl.memory.telemetry import GB, measure

pytestmark = pytest.mark.gpu
MB = 2**20
ENGINE, TRAINER = 512 * MB, 64 * MB


def train_like_phase(device) -> None:
    x = torch.empty(TRAINER, dtype=torch.uint8, device=device)
    del x


def test_a_sleeping_pool_is_taken_out_of_the_trainers_peak(monkeypatch):
    device = torch.device("cuda", 0)
    pool = torch.cuda.MemPool()
    with torch.cuda.use_mem_pool(pool):
        engine = torch.empty(ENGINE, dtype=torch.uint8, device=device)
    instance = SimpleNamespace(pointer_to_data={
        engine.data_ptr(): SimpleNamespace(handle=(0, ENGINE, engine.data_ptr(), []), is_asleep=True)})
    module = ModuleType("vllm.device_allocator.cumem")
    module.CuMemAllocator = SimpleNamespace(instance=instance)
    monkeypatch.setitem(sys.modules, "vllm.device_allocator.cumem", module)
    base = torch.cuda.memory_allocated(device) - ENGINE  # whatever else this process holds
    metrics = {}
    with measure("update_actor", metrics, device):
        train_like_phase(device)
    prefix = "perf/memory/update_actor"
    assert metrics[f"{prefix}/engine_pool_gb"] == 0
    # torch counted the pool (else the trainer's share would come out ENGINE too low)
    assert metrics[f"{prefix}/trainer_peak_gb"] * GB == base + TRAINER
    assert metrics[f"{prefix}/peak_gb"] == metrics[f"{prefix}/trainer_peak_gb"]
    assert metrics[f"{prefix}/device_used_gb"] * GB >= ENGINE  # the stand-in pool is really mapped
    del engine


def test_vllms_asleep_pool_is_not_charged_and_frees_the_device():
    cumem = pytest.importorskip("vllm.device_allocator.cumem")
    device = torch.device("cuda", 0)
    allocator = cumem.CuMemAllocator.get_instance()
    with allocator.use_memory_pool(tag="weights"):
        weights = torch.ones(ENGINE, dtype=torch.uint8, device=device)
    allocated = torch.cuda.memory_allocated(device)
    free_awake = torch.cuda.mem_get_info(device)[0]
    allocator.sleep(offload_tags=("weights",))
    # Sleep unmaps the pages, but torch still counts the tensor.
    assert torch.cuda.memory_allocated(device) == allocated
    assert torch.cuda.mem_get_info(device)[0] - free_awake >= ENGINE - 2 * MB
    metrics = {}
    with measure("update_actor", metrics, device):
        train_like_phase(device)
    prefix = "perf/memory/update_actor"
    assert metrics[f"{prefix}/engine_pool_gb"] == 0
    assert metrics[f"{prefix}/trainer_peak_gb"] * GB == pytest.approx(allocated - ENGINE + TRAINER, abs=2 * MB)
    allocator.wake_up()
    assert int(weights[-1]) == 1  # backed up and restored
