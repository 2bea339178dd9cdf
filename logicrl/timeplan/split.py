"""Separate groups' step time against the colocated step, from the same time plan (predict.py).

    est = split_estimate(cfg, spec, plan, rates, prompt, response)   # None for a colocated run
    print(split_line(est))

With max_staleness=1 the next batch generates on the rollout group while this one is scored and trained on
the trainer group, and the weights cross between them with neither working (trainer/one_step_off.py):
step = max(generate, trainer's phases) + sync; at 0 nothing overlaps: the sum. Each side is its own group's
per-rank time: generation split over the rollout ranks, the rest over the trainer ranks. The colocated
step is every phase on all the devices of both groups, one after another. The sync is the trainer's
gathered stream (predict.py's update_weights) plus its bytes over the link between the groups:
LINK_GBS, a stated constant, not a measurement of this cluster.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from omegaconf import DictConfig

from logicrl.config.async_training import staleness
from logicrl.config.plan import ARR, StepPlan
from logicrl.models.spec import ModelSpec
from logicrl.timeplan.predict import Rates, Shape, predict

# Bytes per second of the trainer->rollout broadcast (workers/collective.py): NCCL between GPUs of one node
# (NVLink-class; PCIe-only GPUs reach a fifth of it), NCCL across nodes (one 200 Gb/s InfiniBand link), and
# gloo over loopback TCP (2.9-4.7 GB/s measured for 256 MB between two processes on a 2-core machine).
LINK_GBS = {"cuda_node": 100.0, "cuda_nodes": 25.0, "cpu": 3.0}
ROLLOUT_SIDE = ("generate",)
SYNC = "update_weights"


@dataclass(frozen=True)
class SplitEstimate:
    split: dict[str, float]  # seconds per phase on the two groups (generate on the rollout group's ranks)
    colocated: dict[str, float]  # seconds per phase with every device colocated
    trainer_ranks: int
    rollout_ranks: int
    staleness: int
    sync_bytes: int
    link: str  # a LINK_GBS key

    @property
    def generate_s(self) -> float:
        return sum(self.split.get(p, 0.0) for p in ROLLOUT_SIDE)

    @property
    def train_s(self) -> float:
        """The trainer group's share: scoring, advantages and the updates."""
        return sum(s for p, s in self.split.items() if p not in (*ROLLOUT_SIDE, SYNC))

    @property
    def sync_s(self) -> float:
        """The trainer's gathered stream and the broadcast over the link."""
        return self.split.get(SYNC, 0.0) + self.sync_bytes / (LINK_GBS[self.link] * 1e9)

    @property
    def step_s(self) -> float:
        if self.staleness:
            return max(self.generate_s, self.train_s) + self.sync_s
        return self.generate_s + self.train_s + self.sync_s

    @property
    def colocated_s(self) -> float:
        return sum(self.colocated.values())


def colocated_plan(plan: StepPlan) -> StepPlan:
    """`plan` with every device of both groups a colocated rank: each rank's share of the batch and of each
    mini-batch over all of them (rounded up where they do not divide: the busiest rank)."""
    ranks = plan.ranks + plan.rollout_ranks
    updates = {role: replace(u, per_rank_mini=math.ceil(u.mini_prompts * plan.n / ranks))
               for role in ("actor", "critic") if (u := plan.update(role)) is not None}
    return replace(plan, ranks=ranks, rollout_ranks=0, **updates)


def link_of(cfg: DictConfig, device: str) -> str:
    """The link the weights cross: one node when both groups fit on one (each a single node)."""
    if device == "cpu":
        return "cpu"
    return "cuda_node" if cfg.trainer.nnodes == 1 and cfg.rollout.nnodes == 1 else "cuda_nodes"


def split_estimate(cfg: DictConfig, spec: ModelSpec, plan: StepPlan, rates: Rates, prompt: int,
                   response: int) -> SplitEstimate | None:
    """The two groups' step against the colocated one; None for a colocated run."""
    if not plan.rollout_ranks:
        return None
    device = "cuda" if rates.gpu else "cpu"
    dtype_bytes = 2 if rates.gpu else 4
    lora = cfg[ARR].model.lora_rank and cfg[ARR].rollout.lora_sync == "adapters"
    # The payload: every weight in the compute dtype, or the adapters alone (as predict.py counts them).
    shape = Shape.of(spec, lora_rank=cfg[ARR].model.lora_rank, target_modules=cfg[ARR].model.target_modules,
                     dtype_bytes=dtype_bytes)
    payload = (shape.lora_params if lora else shape.params) * dtype_bytes
    return SplitEstimate(split=predict(cfg, spec, plan, rates, prompt, response),
                         colocated=predict(cfg, spec, colocated_plan(plan), rates, prompt, response),
                         trainer_ranks=plan.ranks, rollout_ranks=plan.rollout_ranks, staleness=staleness(cfg),
                         sync_bytes=payload, link=link_of(cfg, device))


def split_line(est: SplitEstimate) -> str:
    """The estimate as printed under the time plan, saying which layout is expected to be faster and why."""
    total = est.trainer_ranks + est.rollout_ranks
    gen = f"generate {est.generate_s:.3g} s on {est.rollout_ranks} rollout device(s)"
    train = f"scoring and update {est.train_s:.3g} s on {est.trainer_ranks} trainer device(s)"
    sync = (f"weight sync {est.sync_s:.3g} s ({est.sync_bytes / 1e9:.3g} GB at {LINK_GBS[est.link]:g} GB/s, "
            f"{ {'cuda_node': 'NCCL in one node', 'cuda_nodes': 'NCCL across nodes', 'cpu': 'gloo'}[est.link]})")
    shape = f"max({gen}, {train})" if est.staleness else f"{gen} + {train} (max_staleness=0: no overlap)"
    line = (f"async step: {shape} + {sync} = {est.step_s:.3g} s; colocated on all {total} devices: "
            f"{est.colocated_s:.3g} s (generate {est.colocated.get('generate', 0.0):.3g} s)")
    if est.step_s < est.colocated_s:
        return line + f": two groups expected faster, {est.colocated_s / est.step_s:.2f}x"
    if not est.staleness:
        why = "max_staleness=0 overlaps nothing, so the split only adds the sync over the link"
    elif est.generate_s >= est.train_s:
        why = (f"generation on {est.rollout_ranks} of {total} devices takes longer than the update it hides behind "
               f"(more rollout devices: rollout.n_gpus_per_node)")
    else:
        why = (f"the update on {est.trainer_ranks} of {total} devices takes longer than colocated generation and "
               f"update together (short responses or few devices: generation is too small a share to hide)")
    return line + f": colocated sync is expected to be faster ({est.step_s / est.colocated_s:.2f}x the step): {why}"
