"""The vLLM engine's KV-cache budget on CPU: sized from the config, not half the machine per rank."""

import torch
from omegaconf import OmegaConf

from logicrl.workers.rollout.engines import MIN_KV_CACHE_GB, kv_cache_gb


def cfg(prompt, response, kv=None):
    return OmegaConf.create({"actor_rollout_ref": {"model": {"path": "embedded:tiny"}, "rollout": {"kv_cache_gb": kv}},
                             "data": {"max_prompt_length": prompt, "max_response_length": response}})


def test_cpu_budget_is_what_full_length_sequences_need():
    # tiny model: 2 (K and V) x 2 layers x 1 kv head x 64 dims x 4 bytes = 1024 bytes per token;
    # 1024 sequences x 2000 tokens = 2,048,000 tokens -> 2,097,152,000 bytes = 1.953125 GiB
    assert kv_cache_gb(cfg(1000, 1000), torch.float32, torch.device("cpu"), 1024) == 1.953125
    # half the bytes per token in bf16
    assert kv_cache_gb(cfg(1000, 1000), torch.bfloat16, torch.device("cpu"), 1024) == 1.953125 / 2


def test_small_budgets_keep_a_floor_and_explicit_values_win():
    assert kv_cache_gb(cfg(10, 10), torch.float32, torch.device("cpu"), 4) == MIN_KV_CACHE_GB
    assert kv_cache_gb(cfg(10, 10, kv=3.0), torch.float32, torch.device("cpu"), 4) == 3.0
    # on CUDA, null leaves it to gpu_memory_utilization
    assert kv_cache_gb(cfg(10, 10), torch.float32, torch.device("cuda"), 4) is None
