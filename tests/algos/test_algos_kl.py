"""KL estimators on hand numbers, KL as a reward penalty, and the KL controllers."""

from __future__ import annotations

import math

import pytest
import torch

from logicrl.algos import KL_ESTIMATORS, AdaptiveKLController, apply_kl_penalty, kl_penalty, make_kl_controller

LN2 = math.log(2)


def kl(kl_type, p, q):
    """Estimator value for one token sampled with probability p under pi and q under pi_ref."""
    return kl_penalty(torch.tensor([[math.log(p)]], dtype=torch.float64),
                      torch.tensor([[math.log(q)]], dtype=torch.float64), torch.ones(1, 1), kl_type).item()


def test_estimators_on_hand_numbers():
    # pi = 0.5, pi_ref = 0.25: d = log 2.
    assert kl("kl", 0.5, 0.25) == pytest.approx(LN2)
    assert kl("abs", 0.5, 0.25) == pytest.approx(LN2)
    assert kl("mse", 0.5, 0.25) == pytest.approx(0.5 * LN2**2)
    assert kl("low_var_kl", 0.5, 0.25) == pytest.approx(0.5 - 1 + LN2)  # r = q/p = 0.5: r - 1 - log r
    # pi = 0.25, pi_ref = 0.5: d = -log 2. k1 goes negative, k3 stays positive.
    assert kl("kl", 0.25, 0.5) == pytest.approx(-LN2)
    assert kl("abs", 0.25, 0.5) == pytest.approx(LN2)
    assert kl("mse", 0.25, 0.5) == pytest.approx(0.5 * LN2**2)
    assert kl("low_var_kl", 0.25, 0.5) == pytest.approx(2 - 1 - LN2)


@pytest.mark.parametrize("new, old", [("k1", "kl"), ("k2", "mse"), ("k3", "low_var_kl")])
def test_verl_k_names_are_the_same_estimators(new, old):
    # Current verl names them k1/k2/k3; scripts for the verl Logic-RL forked use kl/mse/low_var_kl.
    assert KL_ESTIMATORS[new] is KL_ESTIMATORS[old]


def test_k_names_on_hand_numbers():
    # pi = 0.5, pi_ref = 0.125: d = log 4 = 2 log 2.
    d = 2 * LN2
    assert kl("k1", 0.5, 0.125) == pytest.approx(d)
    assert kl("k2", 0.5, 0.125) == pytest.approx(0.5 * d**2)  # 2 (log 2)^2
    assert kl("k3", 0.5, 0.125) == pytest.approx(0.25 - 1 + d)  # r = q/p = 1/4: r - 1 - log r
    # pi = 0.25, pi_ref = 0.5: r = 2, k3 = 2 - 1 - log 2, as for low_var_kl above.
    assert kl("k3", 0.25, 0.5) == pytest.approx(1 - LN2)


def test_k3_is_clamped_to_ten_like_low_var_kl():
    # d = log pi - log pi_ref = -15: r = e^15, k3 = e^15 - 1 - 15, far above the clamp of 10.
    out = kl_penalty(torch.tensor([[-15.0]], dtype=torch.float64), torch.tensor([[0.0]], dtype=torch.float64),
                     torch.ones(1, 1), "k3")
    assert out.item() == 10.0


def test_k1_and_k3_are_unbiased_estimates_of_kl():
    # Exact expectation under pi over a 4-token vocabulary: sum_x pi(x) k(x) = KL(pi || pi_ref).
    p = torch.tensor([0.1, 0.2, 0.3, 0.4], dtype=torch.float64)
    q = torch.tensor([0.4, 0.3, 0.2, 0.1], dtype=torch.float64)
    true_kl = (p * (p / q).log()).sum()
    for kl_type in ("kl", "low_var_kl"):
        per_token = KL_ESTIMATORS[kl_type](p.log(), q.log())
        torch.testing.assert_close((p * per_token).sum(), true_kl)
    # k2 is biased (it estimates a different f-divergence): show it differs here.
    assert not torch.isclose((p * KL_ESTIMATORS["mse"](p.log(), q.log())).sum(), true_kl)


def test_low_var_kl_is_clamped_like_verl():
    # Far-off tokens: d clamped to +-20 before exp, k3 clamped to +-10, both finite.
    log_probs = torch.tensor([[0.0, -100.0]], dtype=torch.float64)
    ref = torch.tensor([[-100.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(kl_penalty(log_probs, ref, torch.ones(1, 2), "low_var_kl"),
                               torch.tensor([[10.0, 10.0]], dtype=torch.float64))


def test_kl_penalty_is_zero_on_masked_tokens():
    out = kl_penalty(torch.tensor([[-1.0, -2.0]]), torch.tensor([[-2.0, -9.0]]), torch.tensor([[1, 0]]), "kl")
    torch.testing.assert_close(out, torch.tensor([[1.0, 0.0]]))


def test_apply_kl_penalty_by_hand():
    scores = torch.tensor([[0.0, 0.0, 1.0], [0.0, 2.0, 0.0]], dtype=torch.float64)
    old = torch.tensor([[-1.0, -1.0, -1.0], [-1.0, -1.0, -1.0]], dtype=torch.float64)
    ref = torch.tensor([[-1.5, -0.5, -2.0], [-2.0, -3.0, -1.0]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    rewards, mean_kl = apply_kl_penalty(scores, old, ref, mask, kl_coef=0.1, kl_type="kl")
    # k1 = old - ref: [[0.5, -0.5, 1.0], [1.0, 2.0, -]].
    expected = torch.tensor([[-0.05, 0.05, 0.9], [-0.1, 1.8, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(rewards, expected)
    # Per-sequence token means 1/3 and 1.5, averaged over the two sequences.
    assert mean_kl.item() == pytest.approx((1 / 3 + 1.5) / 2)


def test_adaptive_controller_update_on_hand_numbers():
    ctrl = AdaptiveKLController(kl_coef=0.1, target_kl=0.01, horizon=100)
    ctrl.update(current_kl=0.015, n_steps=10)  # error 0.5 clipped to 0.2: x (1 + 0.2 * 10 / 100)
    assert ctrl.value == pytest.approx(0.102)
    ctrl = AdaptiveKLController(kl_coef=0.1, target_kl=0.01, horizon=100)
    ctrl.update(current_kl=0.009, n_steps=10)  # error -0.1: x (1 - 0.1 * 0.1)
    assert ctrl.value == pytest.approx(0.099)
    ctrl.update(current_kl=0.0, n_steps=50)  # error -1 clipped to -0.2: x (1 - 0.2 * 0.5)
    assert ctrl.value == pytest.approx(0.099 * 0.9)


def test_make_kl_controller_by_name():
    fixed = make_kl_controller("fixed", kl_coef=0.05, target_kl=0.1, horizon=10000)
    fixed.update(current_kl=5.0, n_steps=1000)
    assert fixed.value == 0.05
    adaptive = make_kl_controller("adaptive", kl_coef=0.05, target_kl=0.1, horizon=10000)
    assert (adaptive.target_kl, adaptive.horizon) == (0.1, 10000)
    with pytest.raises(TypeError, match="needs \\['horizon'\\]"):
        make_kl_controller("adaptive", kl_coef=0.05, target_kl=0.1)
    with pytest.raises(ValueError, match="target_kl > 0"):
        make_kl_controller("adaptive", kl_coef=0.05, target_kl=0.0, horizon=10)
