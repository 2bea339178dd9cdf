"""vLLM on a GPU: sleep and wake, weight sync in bf16, and a 2-step run with the vLLM engine.

vLLM's CuMem allocator allows one sleep-mode engine per process, so each test builds its worker in
a spawned process (mp.spawn) and reads back what it measured. The lent GPU machines have no vLLM:
there these skip, and say so; they are for a CUDA box with `make setup`.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from logicrl.config.phases import ARR
from tests.gpu.vllm_worker import MAX_GAP, MEAN_GAP, spawn_one, vllm_worker

pytest.importorskip("vllm", reason="needs vLLM's CUDA build (make setup on a CUDA machine)")
pytestmark = pytest.mark.gpu

GB = 2**30
def _used() -> float:
    free, total = torch.cuda.mem_get_info()
    return (total - free) / GB


def _sleep_and_wake(rank: int, tmp: str, out: str):
    worker, _ = vllm_worker(tmp)
    awake = _used()
    worker.engine.sleep()
    asleep = _used()
    worker.engine.wake()
    torch.save({"awake": awake, "asleep": asleep, "woken": _used()}, out)


def _sync_and_agree(rank: int, tmp: str, out: str, top_p: float):
    from logicrl.trainer.batch import tensors

    worker, prompts = vllm_worker(tmp, f"{ARR}.rollout.top_p={top_p}", f"{ARR}.actor.optim.lr=1e-4")
    gaps = []
    for step in (1, 2):
        batch = tensors(prompts)
        generated, _ = worker.run(batch, "generate", step, params=dict(temperature=1.0, top_p=top_p, max_tokens=16,
                                                                      seed=step))
        batch.update(generated)
        old, metrics = worker.run(batch, "old_log_prob", step)
        gaps.append((metrics["rollout/logprob_diff"], metrics["rollout/logprob_diff_max"]))
        batch.update(old)
        batch["advantages"] = torch.randn(batch["response_mask"].shape) * batch["response_mask"]
        worker.run(batch, "update_actor", step)
        worker.run(None, "update_weights", step)  # step 2 samples from the updated, re-synced weights
    torch.save({"gaps": gaps}, out)


def test_sleep_frees_the_engines_memory_and_wake_restores_it(tmp_path):
    m = spawn_one(_sleep_and_wake, tmp_path)
    # Level 2 discards the weights and the KV cache: the device gets back most of what the engine
    # took at gpu_memory_utilization; waking maps the KV cache again.
    # (rollout.gpu_memory_utilization's share of the card, tens of GB, mostly KV cache).
    assert m["asleep"] < m["awake"] - 1.0, m
    assert m["woken"] > m["asleep"] + 1.0, m


@pytest.mark.parametrize("top_p", [1.0, 0.9])
def test_synced_vllm_log_probs_match_the_trainers_in_bf16(tmp_path, top_p):
    gaps = spawn_one(_sync_and_agree, tmp_path, top_p)["gaps"]
    print(gaps)
    for mean, largest in gaps:
        assert mean < MEAN_GAP and largest < MAX_GAP, gaps


def _train(rank: int, tmp: str, out: str):
    from tests.gpu.runs import train

    rows = train(["trainer.total_training_steps=2", "trainer.device=cuda", f"{ARR}.rollout.name=vllm",
                  "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.save_freq=-1"], Path(tmp))
    torch.save({"rows": rows}, out)


def test_two_grpo_steps_with_the_vllm_engine(tmp_path):
    rows = spawn_one(_train, tmp_path)["rows"]
    assert [r["step"] for r in rows] == [1, 2]
    assert all(r["rollout/logprob_diff"] < MEAN_GAP for r in rows), [r["rollout/logprob_diff"] for r in rows]
