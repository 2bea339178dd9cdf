"""One vLLM hybrid worker in a spawned process on the GPU, for tests/gpu/test_vllm_cuda.py and
test_vllm_lora_cuda.py: `spawn_one(fn, tmp_path, ...)` runs `fn(rank, tmp, out, ...)`, which builds its
worker with `vllm_worker(tmp, *overrides)` and saves what it measured to `out`."""

from __future__ import annotations

from pathlib import Path

import torch
import torch.multiprocessing as mp

from logicrl.config.phases import ARR

# bf16 trainer (HF SDPA) against bf16 vLLM (its own attention and fused kernels) on the same weights:
# per-token gaps of ~1e-3..1e-2 are the known training-inference mismatch; a stale or missing layer
# after a sync gives gaps of order 1. The bounds sit between the two.
MEAN_GAP, MAX_GAP = 0.02, 1.0


def vllm_worker(tmp: str, *overrides: str):
    from omegaconf import OmegaConf

    from logicrl.config import compose, validate
    from logicrl.controller.ports import free_port
    from logicrl.data.dataset import load_prompts
    from logicrl.models.loading import load_tokenizer
    from logicrl.trainer.batch import prompt_batch
    from logicrl.workers.hybrid import HybridWorker
    from tests.conftest import write_jsonl

    data = write_jsonl(Path(tmp) / "train.jsonl", 8)
    cfg, _, plan = validate(compose([f"data.train_files={data}", f"data.val_files={data}", "trainer.device=cuda",
                                     "data.train_batch_size=4", f"{ARR}.rollout.n=4",
                                     f"{ARR}.actor.ppo_mini_batch_size=4",
                                     f"{ARR}.rollout.name=vllm", "data.max_response_length=16", *overrides]))
    worker = HybridWorker(OmegaConf.to_container(cfg, resolve=True), plan, 0, 1, "127.0.0.1", free_port())
    tokenizer = load_tokenizer(cfg[ARR].model.path)
    rows = load_prompts(cfg.data.train_files, tokenizer, max_prompt_length=128)[:4]
    return worker, prompt_batch(rows, 4, tokenizer.pad_token_id)


def spawn_one(fn, tmp_path, *args) -> dict:
    out = str(tmp_path / f"{fn.__name__}.pt")
    mp.spawn(fn, args=(str(tmp_path), out, *args), nprocs=1)
    return torch.load(out)
