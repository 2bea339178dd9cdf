"""The order prompts are drawn in: a seeded shuffle per epoch, fixed-size batches, last one dropped.

A batch is one generation round: a step's data.train_batch_size prompts, or with dynamic sampling
(algorithm.filter_groups) data.gen_batch_size prompts, as many rounds a step as it takes. The count
of rounds drawn is all the state there is, so a resumed run draws exactly the batches it would have
drawn (checkpoints store it as `sampler_position`). Each step's rounds go to `prompts.jsonl` in the
run directory as it ends (`record_draws`): the record a resume is checked against, launch by launch.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch

from logicrl.config.plan import StepPlan

RECORD_FILE = "prompts.jsonl"


class EpochSampler:
    def __init__(self, plan: StepPlan, shuffle: bool, seed: int):
        # The step plan says how many rows there are and how many prompts a round draws (config/plan.py);
        # the sampler only orders them. Without dynamic sampling a round is a step (count_steps' epochs).
        self.n_rows, self.batch_size, self.shuffle, self.seed = plan.train_rows, plan.round_prompts, shuffle, seed
        self.steps_per_epoch = plan.train_rows // plan.round_prompts

    def order(self, epoch: int) -> list[int]:
        if not self.shuffle:
            return list(range(self.n_rows))
        g = torch.Generator().manual_seed(self.seed + epoch)
        return torch.randperm(self.n_rows, generator=g).tolist()

    def epoch_of(self, step: int) -> int:
        """The epoch global round `step` (0-based) belongs to."""
        return step // self.steps_per_epoch

    def batch(self, step: int) -> list[int]:
        """Row indices of global round `step` (0-based; the step without dynamic sampling), across epochs."""
        epoch, k = divmod(step, self.steps_per_epoch)
        return self.order(epoch)[k * self.batch_size:(k + 1) * self.batch_size]


def record_draws(run_dir: Path, step: int, sampler: EpochSampler, rounds: range) -> None:
    """Append step `step`'s line to the run's prompts.jsonl: each round it drew (0-based), that round's epoch
    and its prompts (positions in the training set as loaded, the numbers `batch` returns)."""
    draws = [{"round": r, "epoch": sampler.epoch_of(r), "prompts": sampler.batch(r)} for r in rounds]
    path = run_dir / RECORD_FILE
    try:
        with path.open("a") as f:
            f.write(json.dumps({"step": step, "draws": draws}) + "\n")
    except OSError as err:  # a full disk fails at the close, which names no file: name it (as metrics.jsonl)
        raise OSError(err.errno, err.strerror, str(path)) from err
