"""Metric helpers on hand numbers."""

from __future__ import annotations

import math

import pytest
import torch

from logicrl.algos import (
    advantage_metrics,
    approx_kl_metrics,
    entropy_metrics,
    masked_stats,
    policy_clip_metrics,
    value_clip_metrics,
)


def test_clip_fractions_by_hand():
    ratio = torch.tensor([[math.e, 0.5, 1.0, math.exp(2), 50.0]])
    adv = torch.tensor([[1.0, -1.0, 1.0, -1.0, 1.0]])
    mask = torch.tensor([[1, 1, 1, 1, 0]])  # the masked 50x ratio must not count
    m = policy_clip_metrics(ratio, adv, mask, clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0)
    # token 0: A > 0, r > 1.28 (high); token 1: A < 0, r < 0.8 (low); token 3: A < 0, r > 3 (dual).
    assert m["actor/pg_clipfrac_high"].item() == pytest.approx(0.25)
    assert m["actor/pg_clipfrac_low"].item() == pytest.approx(0.25)
    assert m["actor/pg_clipfrac"].item() == pytest.approx(0.5)
    assert m["actor/pg_clipfrac_lower"].item() == pytest.approx(0.25)  # verl's name for the dual clip's share
    assert policy_clip_metrics(ratio, adv, mask, 0.2, 0.28)["actor/pg_clipfrac_lower"].item() == 0  # none: gspo


def test_approx_kl_by_hand():
    old = torch.tensor([[math.log(0.5), -1.0]])
    new = torch.tensor([[math.log(0.25), -1.0]])
    m = approx_kl_metrics(new, old, torch.ones(1, 2))
    # Token 0: k3 = r - 1 - log r with r = 0.5. Token 1: 0. (ppo_kl, the k1, comes with each loss.)
    assert set(m) == {"actor/approx_kl"}
    assert m["actor/approx_kl"].item() == pytest.approx((0.5 - 1 + math.log(2)) / 2)


def test_entropy_and_value_clip_means():
    mask = torch.tensor([[1, 1, 0]])
    assert entropy_metrics(torch.tensor([[1.0, 3.0, 100.0]]), mask)["actor/entropy"].item() == 2.0
    clipped = torch.tensor([[True, False, True]])
    assert value_clip_metrics(clipped, mask)["critic/vf_clipfrac"].item() == 0.5


def test_advantage_stats_by_hand():
    adv = torch.tensor([[1.0, 2.0, 99.0], [3.0, -99.0, -99.0]])
    mask = torch.tensor([[1, 1, 0], [1, 0, 0]])
    m = advantage_metrics(adv, adv, mask)
    assert {k: round(v.item(), 6) for k, v in m.items() if k.startswith("critic/advantages")} == {
        "critic/advantages/mean": 2.0, "critic/advantages/std": 1.0,  # unbiased: (1 + 0 + 1) / 2
        "critic/advantages/max": 3.0, "critic/advantages/min": 1.0,
    }
    assert set(m) >= {"critic/returns/mean", "critic/returns/max"}


def test_stats_of_nothing_are_zero_not_nan():
    m = masked_stats(torch.randn(2, 3), torch.zeros(2, 3), "x")
    assert all(v.item() == 0 for v in m.values())
