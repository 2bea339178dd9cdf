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


def test_a_resumed_optimizer_takes_this_run_s_lr_weight_decay_and_schedule_at_the_saved_position(tmp_path):
    """The run saved at lr 1e8 (constant, weight decay 0) after 3 updates; the re-run says lr 1e-4, weight
    decay 0.1 and a 4-step warm-up (0.4 x 10 steps). Its next update is the 4th: factor (3 + 1) / 5 = 0.8,
    so lr 8e-5, then 1e-4 once the warm-up is over. AdamW's moments and the step count are the saved ones."""
    from logicrl.workers.checkpoint import load_sharded, load_stage_start, save_sharded

    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    optimizer, scheduler = build_optimizer(model, 1e8, 0.0, 10, 0.0, "constant")
    for _ in range(3):
        model(torch.ones(1, 2)).sum().backward()
        optimizer.step()
        scheduler.step()
    save_sharded(tmp_path / "actor", model, optimizer, scheduler)
    saved_moment = optimizer.state[model.weight]["exp_avg"].clone()

    again = torch.nn.Linear(2, 1)
    optimizer, scheduler = build_optimizer(again, 1e-4, 0.1, 10, 0.4, "constant")
    load_sharded(tmp_path / "actor", again, optimizer, scheduler)
    group = optimizer.param_groups[0]
    assert scheduler.last_epoch == 3 and scheduler.base_lrs == [1e-4]
    assert group["lr"] == pytest.approx(8e-5) and scheduler.get_last_lr() == [group["lr"]]
    assert group["weight_decay"] == 0.1 and group["initial_lr"] == 1e-4
    assert torch.equal(optimizer.state[again.weight]["exp_avg"], saved_moment)
    assert torch.equal(again.weight, model.weight)
    scheduler.step()
    assert group["lr"] == pytest.approx(1e-4)

    # A curriculum stage carrying the moments: its own lr and weight decay, its schedule from the start.
    stage = torch.nn.Linear(2, 1)
    optimizer, scheduler = build_optimizer(stage, 3e-4, 0.05, 10, 0.0, "constant")
    load_stage_start(tmp_path / "actor", stage, optimizer, scheduler, carry_optimizer=True)
    group = optimizer.param_groups[0]
    assert (group["lr"], group["weight_decay"], scheduler.last_epoch) == (3e-4, 0.05, 0)
    assert torch.equal(optimizer.state[stage.weight]["exp_avg"], saved_moment)
