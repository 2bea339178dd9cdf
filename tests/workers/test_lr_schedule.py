"""The learning-rate schedule: warm-up by a ratio of the run's steps or by verl's absolute lr_warmup_steps."""

from __future__ import annotations

import pytest
import torch

from logicrl.workers.fsdp import build_optimizer


def factors(steps: int, **kwargs) -> list[float]:
    optimizer, scheduler = build_optimizer(torch.nn.Linear(2, 1), 1.0, 0.0, **kwargs)
    out = []
    for _ in range(steps):
        out.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    return out


def test_warm_up_by_ratio():
    # 0.4 x 10 steps = 4 warm-up steps: (s + 1) / 5, then constant.
    assert factors(6, total_steps=10, warmup_ratio=0.4, schedule="constant") == pytest.approx(
        [0.2, 0.4, 0.6, 0.8, 1.0, 1.0])


def test_absolute_warm_up_steps_override_the_ratio():
    # verl's optim.lr_warmup_steps: 2 steps whatever the ratio says; -1 hands back to the ratio; 0 is none.
    assert factors(4, total_steps=10, warmup_ratio=0.4, schedule="constant", warmup_steps=2) == pytest.approx(
        [1 / 3, 2 / 3, 1.0, 1.0])
    assert factors(2, total_steps=10, warmup_ratio=0.4, schedule="constant", warmup_steps=-1) == pytest.approx(
        [0.2, 0.4])
    assert factors(2, total_steps=10, warmup_ratio=0.4, schedule="constant", warmup_steps=0) == [1.0, 1.0]


def test_cosine_decays_from_the_end_of_an_absolute_warm_up():
    lrs = factors(6, total_steps=6, warmup_ratio=0.0, schedule="cosine", warmup_steps=2)
    assert lrs[:2] == pytest.approx([1 / 3, 2 / 3]) and lrs[2] == pytest.approx(1.0)
    assert lrs[3] == pytest.approx(0.5 * (1 + torch.cos(torch.tensor(torch.pi / 4)).item()))
