"""The per-rank hybrid worker, built directly (no Ray), on the embedded tiny model."""

import pytest
import torch

from logicrl.config.phases import ARR
from tests.helpers.worker import add, generate, make_worker

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module", params=["hf", "vllm"])
def setup(request):
    return make_worker(request.param)


def test_update_moves_actor_not_reference_and_syncs_engine(setup):
    worker, prompts = setup
    batch, metrics = generate(worker, prompts, seed=3)
    assert "perf/memory/generate/rss_peak_gb" in metrics and "timing_s/generate" in metrics
    # The trainer recomputes the engine's log-probs of the sampled tokens (same weights, fp32).
    metrics = add(worker, batch, "old_log_prob")
    mask = batch["response_mask"].bool()
    old = batch["old_log_probs"].clone()
    torch.testing.assert_close(old[mask], batch["rollout_log_probs"][mask], atol=1e-4, rtol=0)
    assert metrics["rollout/logprob_diff"] < 1e-4  # the production check of the same thing
    assert abs(metrics["rollout_corr/kl"]) < 1e-4 and abs(metrics["rollout_corr/log_ppl_diff"]) < 1e-4
    add(worker, batch, "ref")
    # The forward-only phases resharded their roots (fsdp.reshard): shards (DTensors), not gathered tensors.
    for model in (worker.actor.model, worker.ref_model):
        assert hasattr(model.get_input_embeddings().weight, "to_local")
    batch["advantages"] = torch.randn(batch["responses"].shape) * batch["response_mask"]

    actor_before, ref_before = worker.actor_state(), worker.ref_state()
    _, metrics = worker.run(batch, "update_actor")
    assert "actor/kl_loss" in metrics and "perf/memory/update_actor/rss_peak_gb" in metrics
    # The default token TIS: weights of 1 where the engine agrees with the trainer, none truncated.
    assert metrics["rollout_corr/rollout_is_mean"] == pytest.approx(1, abs=1e-3)
    assert metrics["rollout_corr/rollout_is_ratio_fraction_high"] == 0
    actor_after, ref_after = worker.actor_state(), worker.ref_state()
    assert all(not torch.equal(actor_before[k], actor_after[k]) for k in actor_before)
    assert all(torch.equal(ref_before[k], ref_after[k]) for k in ref_before)

    new, _ = worker.run(batch, "old_log_prob")
    assert not torch.allclose(new["old_log_probs"][mask], old[mask])

    # After the sync the engine samples from, and scores with, the updated policy: its log-probs
    # of fresh samples equal the trainer's recomputation.
    _, metrics = worker.run(None, "update_weights")
    # The 2 MiB tiny model fits the default 512 MiB bucket: one bucket, all of the model.
    model_mb = sum(t.numel() * t.element_size() for t in actor_after.values()) / 2**20
    assert metrics["perf/update_weights/buckets"] == 1
    assert metrics["perf/update_weights/bucket_peak_mb"] == pytest.approx(model_mb)
    batch, _ = generate(worker, prompts, seed=4)
    add(worker, batch, "old_log_prob")
    mask = batch["response_mask"].bool()
    torch.testing.assert_close(batch["old_log_probs"][mask], batch["rollout_log_probs"][mask], atol=1e-4, rtol=0)


@pytest.mark.parametrize("engine, sync", [("vllm", "merged"), ("vllm", "adapters"), ("hf", "adapters")])
def test_lora_actor_syncs_its_engine(engine, sync):
    # merged: the engine holds a plain model and receives W + scale * B @ A (weight_sync.py), the whole
    # model. adapters: the engine holds the base under LoRA and receives only the A/B tensors.
    worker, prompts = make_worker(engine, f"{ARR}.model.lora_rank=4", f"{ARR}.model.lora_alpha=8",
                                  f"{ARR}.rollout.lora_sync={sync}")
    before, _ = generate(worker, prompts, seed=3)
    add(worker, before, "ref")
    before["advantages"] = torch.randn(before["responses"].shape, generator=torch.Generator().manual_seed(0))
    worker.run(before, "update_actor")
    _, metrics = worker.run(None, "update_weights")
    # The bytes handed over: the fp32 tiny model's every weight, or its adapters' alone.
    params = dict(worker.actor.model.named_parameters())
    adapter_bytes = sum(p.numel() * 4 for n, p in params.items() if ".lora_" in n)
    model_bytes = sum(t.numel() * 4 for t in worker.actor_state().values())
    assert metrics["perf/update_weights/bytes"] == (adapter_bytes if sync == "adapters" else model_bytes)
    assert metrics["perf/update_weights/adapters_only"] == float(sync == "adapters")
    assert metrics["perf/update_weights/seconds"] > 0

    after, _ = generate(worker, prompts, seed=3)  # same seed: only the weights differ
    assert not torch.allclose(after["rollout_log_probs"], before["rollout_log_probs"])
    add(worker, after, "old_log_prob")  # peft model, adapters active
    mask = after["response_mask"].bool()
    torch.testing.assert_close(after["old_log_probs"][mask], after["rollout_log_probs"][mask], atol=1e-4, rtol=0)


def test_optimizer_offload_reaches_the_update_and_a_resume(tmp_path, monkeypatch):
    from logicrl.workers import hybrid, update

    worker, prompts = make_worker("hf", f"{ARR}.actor.fsdp_config.optimizer_offload=true",
                                  f"{ARR}.actor.use_kl_loss=false")
    assert worker.actor.role.optimizer_offload
    parked = []
    for module in (update, hybrid):  # both places that send the states to the host
        monkeypatch.setattr(module, "offload_optimizer", lambda opt, seen=parked, real=module.offload_optimizer:
                            seen.append(opt) or real(opt))
    batch, _ = generate(worker, prompts, seed=3)
    batch["advantages"] = torch.randn(batch["responses"].shape) * batch["response_mask"]
    worker.run(batch, "update_actor")
    assert parked == [worker.actor.optimizer]
    states = [v for s in worker.actor.optimizer.state.values() for k, v in s.items() if k != "step"]
    assert states and all(t.device.type == "cpu" for t in states)
    worker.save_checkpoint(str(tmp_path / "ckpt"), save_hf=False, merge_lora=False)
    worker.resume_from(str(tmp_path / "ckpt"))
    assert parked == [worker.actor.optimizer] * 2  # a loaded checkpoint's states go back to the host too
