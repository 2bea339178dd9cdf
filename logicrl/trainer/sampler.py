"""The order prompts are drawn in: a seeded shuffle per epoch, fixed-size batches, last one dropped.

The position (epoch, batch) is all the state there is, so a resumed run draws exactly the
batches it would have drawn (checkpoints store it; issue 7).
"""

from __future__ import annotations

import torch


class EpochSampler:
    def __init__(self, n_rows: int, batch_size: int, shuffle: bool, seed: int):
        if n_rows < batch_size:
            raise ValueError(f"{n_rows} prompts cannot fill one batch of data.train_batch_size={batch_size}")
        self.n_rows, self.batch_size, self.shuffle, self.seed = n_rows, batch_size, shuffle, seed
        self.steps_per_epoch = n_rows // batch_size

    def order(self, epoch: int) -> list[int]:
        if not self.shuffle:
            return list(range(self.n_rows))
        g = torch.Generator().manual_seed(self.seed + epoch)
        return torch.randperm(self.n_rows, generator=g).tolist()

    def batch(self, step: int) -> list[int]:
        """Row indices of global step `step` (0-based), across epochs."""
        epoch, k = divmod(step, self.steps_per_epoch)
        return self.order(epoch)[k * self.batch_size:(k + 1) * self.batch_size]
