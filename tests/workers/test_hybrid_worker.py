"""The per-rank hybrid worker, built directly (no Ray), on the embedded tiny model."""

import pytest
import torch
from omegaconf import OmegaConf

from logicrl.config import compose, validate
from logicrl.controller.worker_group import free_port
from logicrl.data.dataset import load_prompts
from logicrl.models.loading import load_tokenizer
from logicrl.trainer.batch import build_batch
from logicrl.workers.hybrid import HybridWorker
from tests.conftest import ROOT

pytestmark = pytest.mark.integration
ARR = "actor_rollout_ref"


def make_worker(engine: str, *overrides: str):
    """A rank-0 worker of a one-rank run, its tokenizer, and 4 prompts x 4 copies."""
    if engine == "vllm":
        pytest.importorskip("vllm")
    data = ROOT / "data/kk_role"
    if not (data / "train.parquet").is_file():
        pytest.skip("data/kk_role is missing: run `make data`")
    cfg, _, _ = validate(compose([f"data.train_files={data}/train.parquet", f"data.val_files={data}/test.parquet",
                                  f"{ARR}.actor.use_kl_loss=true", "data.max_response_length=4",
                                  f"{ARR}.actor.optim.lr=1e-2", f"{ARR}.rollout.name={engine}", *overrides]))
    worker = HybridWorker(OmegaConf.to_container(cfg, resolve=True), 0, 1, "127.0.0.1", free_port(), total_steps=4)
    tokenizer = load_tokenizer(cfg[ARR].model.path)
    rows = [load_prompts(cfg.data.train_files, tokenizer, max_prompt_length=128)[i] for i in range(4)]
    return worker, tokenizer, [r.input_ids for r in rows for _ in range(4)]


@pytest.fixture(scope="module", params=["hf", "vllm"])
def setup(request):
    return make_worker(request.param)


def test_update_moves_actor_not_reference_and_syncs_engine(setup):
    worker, tokenizer, prompts = setup
    out, metrics = worker.generate(prompts, dict(n=1, temperature=1.0, max_tokens=4, seed=3))
    assert "perf/memory/gen/peak_gb" in metrics and "timing_s/gen" in metrics
    batch = build_batch(prompts, out["responses"], out["response_mask"], tokenizer.pad_token_id)
    # The trainer recomputes the engine's log-probs of the sampled tokens (same weights, fp32).
    old, _ = worker.compute_log_prob(batch)
    mask = out["response_mask"].bool()
    torch.testing.assert_close(old[mask], out["rollout_log_probs"][mask], atol=1e-4, rtol=0)
    batch["old_log_probs"] = old
    batch["ref_log_probs"], _ = worker.compute_ref_log_prob(batch)
    batch["advantages"] = torch.randn(out["responses"].shape) * out["response_mask"]

    actor_before, ref_before = worker.actor_state(), worker.ref_state()
    metrics = worker.update_actor(batch, per_rank_mini=len(prompts))
    assert "actor/kl_loss" in metrics and "perf/memory/update_actor/peak_gb" in metrics
    actor_after, ref_after = worker.actor_state(), worker.ref_state()
    assert all(not torch.equal(actor_before[k], actor_after[k]) for k in actor_before)
    assert all(torch.equal(ref_before[k], ref_after[k]) for k in ref_before)

    new, _ = worker.compute_log_prob(batch)
    assert not torch.allclose(new[mask], old[mask])

    # After the sync the engine samples from, and scores with, the updated policy: its log-probs
    # of fresh samples equal the trainer's recomputation.
    metrics = worker.sync_weights()
    # The 2 MiB tiny model fits the default 512 MiB bucket: one bucket, all of the model.
    model_mb = sum(t.numel() * t.element_size() for t in actor_after.values()) / 2**20
    assert metrics["perf/update_weights/buckets"] == 1
    assert metrics["perf/update_weights/bucket_peak_mb"] == pytest.approx(model_mb)
    out, _ = worker.generate(prompts, dict(n=1, temperature=1.0, max_tokens=4, seed=4))
    batch = build_batch(prompts, out["responses"], out["response_mask"], tokenizer.pad_token_id)
    trainer_view, _ = worker.compute_log_prob(batch)
    mask = out["response_mask"].bool()
    torch.testing.assert_close(trainer_view[mask], out["rollout_log_probs"][mask], atol=1e-4, rtol=0)


def test_lora_actor_streams_merged_weights_into_vllm():
    # The engine holds a plain model: W + scale * B @ A is what it must receive (weight_sync.py).
    worker, tokenizer, prompts = make_worker("vllm", f"{ARR}.model.lora_rank=4", f"{ARR}.model.lora_alpha=8")
    params = dict(n=1, temperature=1.0, max_tokens=4, seed=3)
    before, _ = worker.generate(prompts, params)
    batch = build_batch(prompts, before["responses"], before["response_mask"], tokenizer.pad_token_id)
    batch["ref_log_probs"], _ = worker.compute_ref_log_prob(batch)
    batch["advantages"] = torch.randn(before["responses"].shape, generator=torch.Generator().manual_seed(0))
    worker.update_actor(batch, per_rank_mini=len(prompts))
    worker.sync_weights()

    after, _ = worker.generate(prompts, params)  # same seed: only the weights differ
    assert not torch.allclose(after["rollout_log_probs"], before["rollout_log_probs"])
    batch = build_batch(prompts, after["responses"], after["response_mask"], tokenizer.pad_token_id)
    trainer_view, _ = worker.compute_log_prob(batch)  # peft model, adapters active
    mask = after["response_mask"].bool()
    torch.testing.assert_close(trainer_view[mask], after["rollout_log_probs"][mask], atol=1e-4, rtol=0)
