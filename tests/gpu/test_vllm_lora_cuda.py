"""vLLM's adapter-only LoRA sync on a GPU (rollout.lora_sync=adapters): the engine sleeps at level 1
between rollouts (its base offloaded to the host and back, since no sync re-sends it), each sync hands
it only the adapters, and its bf16 log-probs stay at the merged sync's level over three steps. Needs
vLLM's CUDA build: skips on the lent GPU machines, which have none (tests/gpu/test_vllm_cuda.py)."""

from __future__ import annotations

import pytest
import torch

from logicrl.config.phases import ARR
from tests.gpu.vllm_worker import MAX_GAP, MEAN_GAP, spawn_one, vllm_worker

pytest.importorskip("vllm", reason="needs vLLM's CUDA build (make setup on a CUDA machine)")
pytestmark = pytest.mark.gpu

LORA = [f"{ARR}.model.lora_rank=32", f"{ARR}.model.lora_alpha=64", f"{ARR}.actor.optim.lr=1e-3"]


def _steps(rank: int, tmp: str, out: str, sync: str):
    from logicrl.trainer.batch import tensors

    worker, prompts = vllm_worker(tmp, *LORA, f"{ARR}.rollout.lora_sync={sync}")
    rows = []
    for step in (1, 2, 3):
        batch = tensors(prompts)
        generated, _ = worker.run(batch, "generate", step, params=dict(temperature=1.0, max_tokens=16, seed=step))
        batch.update(generated)  # generate ended with engine.sleep(): level 1 for adapters, 2 for merged
        old, metrics = worker.run(batch, "old_log_prob", step)
        batch.update(old)
        batch["advantages"] = torch.randn(batch["response_mask"].shape) * batch["response_mask"]
        worker.run(batch, "update_actor", step)
        _, synced = worker.run(None, "update_weights", step)
        rows.append(dict(mean=metrics["rollout/logprob_diff"], max=metrics["rollout/logprob_diff_max"],
                         bytes=synced["perf/update_weights/bytes"], seconds=synced["perf/update_weights/seconds"],
                         level=worker.engine.sleep_level))
    torch.save({"rows": rows}, out)


def test_adapter_sync_on_cuda_keeps_the_merged_sync_level(tmp_path):
    adapters = spawn_one(_steps, tmp_path, "adapters")["rows"]
    merged = spawn_one(_steps, tmp_path, "merged")["rows"]
    print("adapters", adapters, "\nmerged", merged)
    assert all(r["level"] == 1 for r in adapters) and all(r["level"] == 2 for r in merged)
    # Steps 2 and 3 sample from synced adapters after a level-1 sleep: within the bf16 bounds.
    assert all(r["mean"] < MEAN_GAP and r["max"] < MAX_GAP for r in adapters), adapters
    # The tiny model all-linear at r=32: 149,504 adapter numbers against 630,784 in its Linears and
    # embedding alone, 4.2x (a 7B shape: ~94x, benchmarks/lora_sync.py).
    assert adapters[0]["bytes"] * 4 < merged[0]["bytes"], (adapters[0], merged[0])
