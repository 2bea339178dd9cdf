"""The hybrid worker with use_remove_padding=true: every trained forward runs packed, through the
real phases, and the trainer's packed log-probs still equal the engine's (fp32)."""

import pytest
import torch

from logicrl.config.phases import ARR
from tests.helpers.worker import add, generate, make_worker

pytestmark = pytest.mark.integration


def test_packed_worker_matches_engine_and_trains_actor_and_critic():
    worker, prompts = make_worker("hf", f"{ARR}.model.use_remove_padding=true", "algorithm.adv_estimator=gae",
                                  "trainer.critic_warmup=0")
    assert worker.actor.remove_padding and worker.critic.remove_padding
    batch, _ = generate(worker, prompts, seed=3)
    metrics = add(worker, batch, "old_log_prob")
    mask = batch["response_mask"].bool()
    torch.testing.assert_close(batch["old_log_probs"][mask], batch["rollout_log_probs"][mask], atol=1e-4, rtol=0)
    assert metrics["rollout/logprob_diff"] < 1e-4
    add(worker, batch, "ref")
    torch.testing.assert_close(batch["ref_log_probs"], batch["old_log_probs"], atol=1e-6, rtol=0)  # no step yet
    add(worker, batch, "values")
    assert (batch["values"][~mask] == 0).all() and batch["values"][mask].abs().sum() > 0
    batch["advantages"] = torch.randn(batch["responses"].shape) * batch["response_mask"]
    batch["returns"] = torch.randn(batch["responses"].shape) * batch["response_mask"]
    before = worker.actor_state()
    _, metrics = worker.run(batch, "update_critic")
    assert torch.isfinite(torch.tensor(metrics["critic/vf_loss"]))
    _, metrics = worker.run(batch, "update_actor")
    assert torch.isfinite(torch.tensor(metrics["actor/pg_loss"]))
    after = worker.actor_state()
    assert all(not torch.equal(before[k], after[k]) for k in before)
