"""Policy losses (vanilla PPO clip with clip-higher and dual clip, GSPO), entropy bonus, value loss."""

from __future__ import annotations

import math

import pytest
import torch

from logicrl.algos import agg_loss, compute_policy_loss, entropy_bonus, value_loss

LOW, HIGH, C = 0.2, 0.28, 3.0


def vanilla(log_ratio, advantage):
    """One-token vanilla loss and its gradient d loss / d log_prob."""
    log_probs = torch.tensor([[log_ratio]], dtype=torch.float64, requires_grad=True)
    out = compute_policy_loss("vanilla", log_probs, torch.zeros(1, 1, dtype=torch.float64),
                              torch.tensor([[advantage]], dtype=torch.float64), torch.ones(1, 1),
                              clip_ratio_low=LOW, clip_ratio_high=HIGH, clip_ratio_c=C)
    out.token_loss.sum().backward()
    return out.token_loss.item(), log_probs.grad.item(), out.ratio.item()


def test_ratio_e_with_positive_advantage_is_clipped_at_one_plus_clip_ratio_high():
    loss, grad, ratio = vanilla(1.0, 1.0)
    assert ratio == pytest.approx(math.e)
    assert loss == pytest.approx(-(1 + HIGH))
    assert grad == 0  # past the clip the token no longer pushes its probability up


def test_inside_the_clip_range_the_loss_is_minus_advantage_times_ratio():
    loss, grad, _ = vanilla(0.1, 2.0)
    r = math.exp(0.1)
    assert loss == pytest.approx(-2.0 * r)
    assert grad == pytest.approx(-2.0 * r)  # d(-A r)/d log pi = -A r


def test_the_clip_is_pessimistic_a_low_ratio_with_positive_advantage_is_not_clipped():
    loss, grad, _ = vanilla(-1.0, 1.0)  # r = 1/e < 1 - LOW, but raising it is what we want
    assert loss == pytest.approx(-math.exp(-1.0))
    assert grad == pytest.approx(-math.exp(-1.0))


def test_low_ratio_with_negative_advantage_is_clipped_at_one_minus_clip_ratio_low():
    loss, grad, _ = vanilla(-1.0, -1.0)
    assert loss == pytest.approx(1 - LOW)
    assert grad == 0


def test_asymmetric_bounds_are_used_on_their_own_side():
    # r = 1.25 lies inside [0.8, 1.28] (clip-higher) though it is outside a symmetric 0.2 clip.
    loss, grad, _ = vanilla(math.log(1.25), 1.0)
    assert loss == pytest.approx(-1.25) and grad == pytest.approx(-1.25)


def test_dual_clip_caps_a_negative_advantage_at_clip_ratio_c():
    loss, grad, ratio = vanilla(2.0, -1.0)  # r = e^2 = 7.39 > C
    assert ratio == pytest.approx(math.exp(2.0))
    assert loss == pytest.approx(C)  # plain PPO would give 7.39
    assert grad == 0
    loss, grad, _ = vanilla(math.log(2.0), -1.5)  # r = 2 < C: ordinary PPO, loss -A r = 3
    assert loss == pytest.approx(3.0) and grad == pytest.approx(3.0)


def test_dual_clip_does_not_touch_positive_advantages():
    loss, _, _ = vanilla(2.0, 1.0)
    assert loss == pytest.approx(-(1 + HIGH))


def test_clip_ratio_c_must_exceed_one():
    with pytest.raises(ValueError, match="clip_ratio_c=1.0 must be > 1"):
        compute_policy_loss("vanilla", torch.zeros(1, 1), torch.zeros(1, 1), torch.ones(1, 1), torch.ones(1, 1),
                            clip_ratio_low=LOW, clip_ratio_high=HIGH, clip_ratio_c=1.0)


# ---------------------------------------------------------------- gspo
def test_gspo_ratio_is_the_length_normalised_sequence_ratio():
    log_probs = torch.tensor([[0.1, 0.3, 5.0]], dtype=torch.float64)  # third token is padding
    mask = torch.tensor([[1, 1, 0]], dtype=torch.bool)
    out = compute_policy_loss("gspo", log_probs, torch.zeros_like(log_probs), torch.ones_like(log_probs), mask,
                              clip_ratio_low=0.5, clip_ratio_high=0.5)
    s = math.exp(0.2)  # exp(mean(0.1, 0.3))
    torch.testing.assert_close(out.ratio, torch.tensor([[s, s, 1.0]], dtype=torch.float64))
    torch.testing.assert_close(out.token_loss, torch.tensor([[-s, -s, 0.0]], dtype=torch.float64))


def test_gspo_clips_the_whole_sequence():
    log_probs = torch.tensor([[0.001, -0.0002]], dtype=torch.float64)  # mean 4e-4: s = 1.0004 > 1 + 3e-4
    out = compute_policy_loss("gspo", log_probs, torch.zeros_like(log_probs), torch.ones_like(log_probs),
                              torch.ones(1, 2), clip_ratio_low=3e-4, clip_ratio_high=3e-4)
    torch.testing.assert_close(out.token_loss, torch.full((1, 2), -(1 + 3e-4), dtype=torch.float64))


def test_gspo_token_gradient_equals_the_sequence_level_gradient():
    # Under seq-mean-token-mean the GSPO-token loss must give the paper's sequence objective
    # -A * s(theta) its gradient: d/d log pi_t = -A * s / |y|.
    torch.manual_seed(0)
    log_probs = (0.1 * torch.randn(2, 4, dtype=torch.float64)).requires_grad_()
    old = 0.1 * torch.randn(2, 4, dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1, 1], [1, 1, 0, 0]], dtype=torch.bool)
    adv = torch.tensor([[1.5] * 4, [-0.5] * 4], dtype=torch.float64)
    out = compute_policy_loss("gspo", log_probs, old, adv, mask, clip_ratio_low=0.9, clip_ratio_high=10.0)
    (grad_token,) = torch.autograd.grad(agg_loss(out.token_loss, mask, "seq-mean-token-mean"), log_probs)

    lengths = mask.sum(-1)
    s = torch.exp(((log_probs - old) * mask).sum(-1) / lengths)
    (grad_seq,) = torch.autograd.grad((-adv[:, 0] * s).mean(), log_probs)
    torch.testing.assert_close(grad_token, grad_seq * mask)


# ---------------------------------------------------------------- entropy bonus
def test_entropy_bonus_is_minus_coeff_times_entropy_and_its_descent_raises_entropy():
    entropy = torch.tensor([[1.0, 2.0, 7.0]], dtype=torch.float64, requires_grad=True)
    mask = torch.tensor([[1, 1, 0]], dtype=torch.bool)
    bonus = entropy_bonus(entropy, mask, 0.01)
    torch.testing.assert_close(bonus, torch.tensor([[-0.01, -0.02, 0.0]], dtype=torch.float64))
    agg_loss(bonus, mask, "token-mean").backward()
    torch.testing.assert_close(entropy.grad, torch.tensor([[-0.005, -0.005, 0.0]], dtype=torch.float64))


# ---------------------------------------------------------------- value loss
def test_value_loss_clipped_branch_by_hand():
    values = torch.tensor([[2.0, 1.2]], dtype=torch.float64, requires_grad=True)
    old = torch.tensor([[1.0, 1.0]], dtype=torch.float64)
    returns = torch.tensor([[3.0, 3.0]], dtype=torch.float64)
    out = value_loss(values, old, returns, torch.ones(1, 2), cliprange_value=0.5)
    # Token 0: V moved 1.0 > 0.5, V_clip = 1.5: max((2-3)^2, (1.5-3)^2) / 2 = 1.125, clipped, no gradient.
    # Token 1: V moved 0.2 <= 0.5: both branches (1.2-3)^2 = 3.24, loss 1.62, gradient V - R = -1.8.
    torch.testing.assert_close(out.token_loss, torch.tensor([[1.125, 1.62]], dtype=torch.float64))
    assert out.clipped.tolist() == [[True, False]]
    out.token_loss.sum().backward()
    torch.testing.assert_close(values.grad, torch.tensor([[0.0, -1.8]], dtype=torch.float64))


def test_value_loss_is_unclipped_when_moving_away_from_the_target():
    # The max keeps the larger error: moving V from 1.0 to 0.0 with R = 3 is worse, not clipped.
    out = value_loss(torch.tensor([[0.0]]), torch.tensor([[1.0]]), torch.tensor([[3.0]]), torch.ones(1, 1), 0.5)
    torch.testing.assert_close(out.token_loss, torch.tensor([[4.5]]))
    assert not out.clipped.any()
