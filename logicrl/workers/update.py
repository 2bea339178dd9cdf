"""The one PPO-style update loop, shared by the actor and the critic.

    metrics = run_update(role, batch, loss_fn, retry)

ppo_epochs passes over a rank's batch in mini-batches of `per_rank_mini` rows, one optimizer step
each, as micro-batches whose gradients accumulate. The loss normaliser is fixed per mini-batch across
ranks (algos/aggregation.py), so however a mini-batch is split its loss is the same, and FSDP2's
averaging over ranks is undone by the world-size factor. A mini-batch is the unit of OOM retry
(workers/oom.py): the optimizer has not stepped, so a re-run counts nothing twice. Metrics: `<role>/loss`
sums a mini-batch's micro-batches, every other value is their mean; across mini-batches, the mean.
A non-finite (global) gradient norm skips its optimizer step on every rank, as verl does, counted in
`<role>/nonfinite_steps`; the lr schedule still advances (docs/faults.md, "Divergence").
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
from tensordict import TensorDict

from logicrl.algos import loss_normalizer
from logicrl.config.plan import Update
from logicrl.workers.fsdp import (
    all_reduce_sum,
    clip_grad_norm,
    drop_unreduced_grads,
    load_optimizer,
    offload_optimizer,
)
from logicrl.workers.micro import split_fixed
from logicrl.workers.oom import MicroSize

# (micro-batch, normaliser) -> (the micro-batch's loss, its metrics)
LossFn = Callable[[TensorDict, float], tuple[torch.Tensor, dict[str, float]]]


@dataclass(kw_only=True)  # nine fields: built by name
class Trained:
    """A trained role: its sharded model, optimizer and schedule, and how it splits its batch."""

    name: str  # "actor" or "critic": the metrics' prefix
    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    scheduler: object
    plan: Update  # mini-batches and epochs (config/plan.py); the micro-batch comes with each retry
    loss_agg_mode: str
    grad_clip: float
    world_size: int
    device: torch.device
    optimizer_offload: bool = False  # AdamW states on the host outside run_update
    # fsdp_config.grad_accumulation resolved (config/plan.py Update): True reduce-scatters every
    # micro-batch's backward, so only gradient shards accumulate; False syncs once per mini-batch.
    sharded_grads: bool = False


def run_update(role: Trained, batch: TensorDict, loss_fn: LossFn, retry) -> dict[str, float]:
    role.model.train()
    if role.optimizer_offload:
        load_optimizer(role.optimizer)
    records: dict[str, list[float]] = {}
    skipped = 0
    for _ in range(role.plan.ppo_epochs):
        for mini in split_fixed(batch, role.plan.per_rank_mini):
            stats, stepped = _step(role, mini, loss_fn, retry)
            skipped += not stepped
            for key, value in stats.items():
                records.setdefault(key, []).append(value)
    role.scheduler.step()
    if role.optimizer_offload:  # not on an exception: the run ends then, and a CUDA error would repeat here
        offload_optimizer(role.optimizer)
    metrics = {k: sum(v) / len(v) for k, v in records.items()}
    metrics[f"{role.name}/lr"] = role.scheduler.get_last_lr()[0]
    metrics[f"{role.name}/nonfinite_steps"] = float(skipped)
    return metrics


def _step(role: Trained, mini: TensorDict, loss_fn: LossFn, retry) -> tuple[dict[str, float], bool]:
    """One mini-batch's forward, backward and optimizer step: its metrics, and whether the optimizer stepped."""
    normalizer = all_reduce_sum(float(loss_normalizer(mini["response_mask"], role.loss_agg_mode)), role.device)
    stats = retry(lambda size: _accumulate(role, mini, size, normalizer, loss_fn),
                  reset=lambda: drop_unreduced_grads(role.model))
    grad_norm = clip_grad_norm(role.model, role.grad_clip, role.device)
    # NaN or inf anywhere on any rank makes the global norm non-finite on every rank (the all-reduce
    # sums it in), so the ranks agree without a collective of their own. Stepping would write NaN into
    # the weights and into AdamW's moments, from which no later step recovers.
    stepped = math.isfinite(grad_norm)
    if stepped:
        role.optimizer.step()
    role.optimizer.zero_grad(set_to_none=True)
    stats[f"{role.name}/grad_norm"] = grad_norm
    return stats, stepped


def _accumulate(role: Trained, mini: TensorDict, size: MicroSize, normalizer: float,
                loss_fn: LossFn) -> dict[str, float]:
    """Forward + backward of every micro-batch of `mini`, split as `size` says (gradients add up);
    the mini-batch's metrics."""
    micro_batches = size.split(mini, role.device)
    sums: dict[str, torch.Tensor] = {}
    for i, micro in enumerate(micro_batches):
        # Unsharded (verl never turns sync off; this is the faster path): gradients are reduced
        # across ranks once, with the last micro-batch's backward, and until then every rank holds
        # them full-size. Sharded: every backward reduce-scatters and FSDP2 adds the result into the
        # sharded .grad, so only 1/W of the gradients is resident, for one collective per micro-batch.
        role.model.set_requires_gradient_sync(role.sharded_grads or i == len(micro_batches) - 1)
        loss, stats = loss_fn(micro, normalizer)
        (loss * role.world_size).backward()
        # The metrics stay on the device until the mini-batch ends and then come to the host in one
        # copy: a float() per value per micro-batch is a CUDA sync each, which leaves the GPU idle
        # while the host queues the next micro-batch. float64 sums add exactly as Python floats did.
        for key, value in {**stats, f"{role.name}/loss": loss.detach()}.items():
            value = torch.as_tensor(value, dtype=torch.float64, device=role.device)
            sums[key] = sums[key] + value if key in sums else value
    totals = dict(zip(sums, torch.stack(list(sums.values())).tolist()))
    out = {key: value / len(micro_batches) for key, value in totals.items()}
    out[f"{role.name}/loss"] = totals[f"{role.name}/loss"]  # the mini-batch's loss: a sum, not a mean
    return out
