"""One hybrid worker built in-process (no Ray) on the embedded tiny model, and its phases run by name:
the set-up tests/workers/test_hybrid_worker.py, test_qlora_worker.py, test_gptq_worker.py,
test_fp32_master.py and test_packing_worker.py share."""

import pytest
import torch
from omegaconf import OmegaConf

from logicrl.config import compose, validate
from logicrl.config.phases import ARR
from logicrl.controller.ports import free_port
from logicrl.data.dataset import load_prompts
from logicrl.models.loading import load_tokenizer
from logicrl.trainer.batch import prompt_batch, tensors
from logicrl.workers.hybrid import HybridWorker
from tests.conftest import need_data

# The embedded tiny model in fp32: embeddings 763 x 128 (tied to the head), per layer q 128x128 + 128,
# k and v 64x128 + 64 each, o 128x128, gate/up/down 352x128 each, two norms of 128; a final norm.
BASE_BYTES = (763 * 128 + 2 * (128 * 128 + 128 + 2 * (64 * 128 + 64) + 128 * 128 + 3 * 352 * 128 + 2 * 128) + 128) * 4
# LoRA rank 4 on q_proj, v_proj, down_proj (test_qlora_worker.py QLORA), per layer: q A [4, 128] + B [128, 4],
# v A [4, 128] + B [64, 4], down A [4, 352] + B [128, 4]; fp32.
ADAPTER_BYTES = 2 * (4 * 128 + 128 * 4 + 4 * 128 + 64 * 4 + 4 * 352 + 128 * 4) * 4


def make_worker(engine: str, *overrides: str):
    """A rank-0 worker of a one-rank run, and its batch: 4 prompts x n=4, one mini-batch of 16."""
    if engine == "vllm":
        pytest.importorskip("vllm")
    data = need_data("kk_role")
    # preset=embedded: the embedded default's values whatever model.path an override names.
    cfg, _, plan = validate(compose(["preset=embedded", f"data.train_files={data}/train.parquet",
                                     f"data.val_files={data}/test.parquet",
                                     f"{ARR}.actor.use_kl_loss=true", "data.max_response_length=4",
                                     "data.train_batch_size=4", f"{ARR}.rollout.n=4",
                                     f"{ARR}.actor.ppo_mini_batch_size=4", f"{ARR}.actor.optim.lr=1e-2",
                                     f"{ARR}.rollout.name={engine}",
                                     # fp32 on any device: the 1e-4 engine/trainer agreement below is an
                                     # fp32 bound (auto would be bf16 on a CUDA box; tests/gpu checks bf16).
                                     f"{ARR}.model.dtype=float32", *overrides]))
    worker = HybridWorker(OmegaConf.to_container(cfg, resolve=True), plan, 0, 1, "127.0.0.1", free_port())
    tokenizer = load_tokenizer(cfg[ARR].model.path)
    rows = load_prompts(cfg.data.train_files, tokenizer, max_prompt_length=128).rows[:4]
    return worker, prompt_batch(rows, 4, tokenizer.pad_token_id)


def generate(worker, prompts, seed: int):
    """The rank's generate phase on `prompts`: the batch with the responses added, and the metrics."""
    batch = tensors(prompts)  # a new TensorDict: the fixture's stays as it is
    out, metrics = worker.run(batch, "generate", params=dict(temperature=1.0, max_tokens=4, seed=seed))
    batch.update(out)
    return batch, metrics


def add(worker, batch, phase: str):
    out, metrics = worker.run(batch, phase)
    batch.update(out)
    return metrics


def step(worker, prompts, seed: int):
    """generate, old_log_prob, ref and one update on fixed advantages; returns the batch and its metrics."""
    batch, _ = generate(worker, prompts, seed=seed)
    metrics = add(worker, batch, "old_log_prob")
    add(worker, batch, "ref")
    batch["advantages"] = torch.randn(batch["responses"].shape, generator=torch.Generator().manual_seed(seed))
    worker.run(batch, "update_actor")
    metrics.update(worker.run(None, "update_weights")[1])
    return batch, metrics


def trained(worker) -> dict[str, torch.Tensor]:
    """The adapters and their AdamW states, as this rank stores them."""
    out = {n: p.detach().clone() for n, p in worker.actor.model.named_parameters() if p.requires_grad}
    for i, state in enumerate(worker.actor.optimizer.state.values()):
        out.update({f"{i}/{k}": v.clone() for k, v in state.items()})
    return out
