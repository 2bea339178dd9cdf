"""The order prompts are drawn in: a seeded shuffle per epoch, fixed-size batches, last one dropped.

The position (epoch, batch) is all the state there is, so a resumed run draws exactly the
batches it would have drawn (checkpoints store it).
"""

from __future__ import annotations

import torch

from logicrl.config.plan import StepPlan


class EpochSampler:
    def __init__(self, plan: StepPlan, shuffle: bool, seed: int):
        # The step plan says how many rows there are and how many batches an epoch holds
        # (config/plan.py count_steps); the sampler only orders them.
        self.n_rows, self.batch_size, self.shuffle, self.seed = plan.train_rows, plan.prompts, shuffle, seed
        self.steps_per_epoch = plan.steps_per_epoch

    def order(self, epoch: int) -> list[int]:
        if not self.shuffle:
            return list(range(self.n_rows))
        g = torch.Generator().manual_seed(self.seed + epoch)
        return torch.randperm(self.n_rows, generator=g).tolist()

    def batch(self, step: int) -> list[int]:
        """Row indices of global step `step` (0-based), across epochs."""
        epoch, k = divmod(step, self.steps_per_epoch)
        return self.order(epoch)[k * self.batch_size:(k + 1) * self.batch_size]
