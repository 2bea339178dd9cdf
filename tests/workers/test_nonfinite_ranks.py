"""A NaN gradient on one rank of two (FSDP2 over gloo, no Ray): the global gradient norm is NaN on both,
so both skip the optimizer step and count it, and their shards stay as they were and finite; the
next, finite mini-batch steps on both. The ranks agree with no collective of the update's own."""

import pytest
import torch

from logicrl.controller.ports import free_port
from tests.helpers.spawn import spawn

pytestmark = pytest.mark.integration


def _rank(rank: int, world: int, port: int, path: str):
    from logicrl.config.plan import Micro, Update
    from logicrl.workers.actor import response_logprobs
    from logicrl.workers.fsdp import build_optimizer, has_nonfinite, init_distributed, shard_model
    from logicrl.workers.oom import MicroSize
    from logicrl.workers.update import Trained, run_update
    from tests.helpers.actor_ranks import make_batch
    from tests.workers.conftest import build_tiny_qwen2, leave_group

    torch.set_num_threads(1)
    device = torch.device("cpu")
    mesh = init_distributed(rank, world, "127.0.0.1", port, device, timeout_s=60)
    model = shard_model(build_tiny_qwen2(seed=0), mesh, device)
    optimizer, scheduler = build_optimizer(model, 1e-3, 0.0, 10, 0.0, "constant")
    plan = Update(mini_prompts=2, per_rank_mini=2, micro=Micro("ppo_micro_batch_size_per_gpu", 2), ppo_epochs=1,
                  num_mini=2)
    role = Trained(name="actor", model=model, optimizer=optimizer, scheduler=scheduler, plan=plan,
                   loss_agg_mode="token-mean", grad_clip=1.0, world_size=world, device=device)
    shards = [p.to_local().clone() for p in model.parameters()]
    calls = []

    def loss_fn(micro, normalizer):
        log_probs, _ = response_logprobs(model, micro, 1.0)
        loss = -(log_probs * micro["response_mask"]).sum() / normalizer
        calls.append(len(calls))
        # Rank 1's first mini-batch goes NaN (one rank's bad batch); everything else is finite.
        return (loss * float("nan") if rank == 1 and len(calls) == 1 else loss), {}

    def retry(attempt, reset=None):
        return attempt(MicroSize("update_actor", "ppo_micro_batch_size_per_gpu", 2))

    # Two mini-batches of two rows per rank: the first skipped on both ranks, the second stepped on both.
    batch = make_batch(n=8).chunk(world)[rank]
    metrics = run_update(role, batch, loss_fn, retry)
    moved = sum(not torch.equal(a, p.to_local()) for a, p in zip(shards, model.parameters()))
    steps = {int(s["step"]) for s in optimizer.state.values()}
    torch.save({"metrics": metrics, "moved": moved, "params": len(shards), "steps": steps,
                "nonfinite": has_nonfinite(model.parameters())}, f"{path}.{rank}")
    leave_group()


def test_a_nan_gradient_on_one_rank_skips_the_step_on_both(tmp_path):
    out = str(tmp_path / "rank")
    spawn(_rank, args=(2, free_port(), out), nprocs=2)
    for rank in range(2):
        record = torch.load(f"{out}.{rank}", weights_only=False)
        assert record["metrics"]["actor/nonfinite_steps"] == 1.0, rank  # the NaN mini-batch, on both ranks
        assert record["steps"] == {1}, rank  # the finite one stepped: AdamW counted one step, not two
        assert record["moved"] > 0 and not record["nonfinite"], rank  # that step moved the shards, nothing NaN
