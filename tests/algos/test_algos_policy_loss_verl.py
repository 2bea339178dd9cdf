"""The losses verl registers beside vanilla and gspo: CISPO, GMPO (geo_mean), SAPO, GPG, Clip-Cov, KL-Cov.

Each against numbers derived by hand from its paper's formula, with its clip (or gate, or selection)
active in one case and not in the other; gradients are d loss / d log pi of the token.
"""

from __future__ import annotations

import math

import pytest
import torch

from logicrl.algos import compute_policy_loss

F64 = torch.float64


def run(mode, log_ratios, advantages, *, log_probs=None, low=0.2, high=0.2, **params):
    """One response of len(log_ratios) tokens: (token losses, d sum(loss) / d log pi per token)."""
    lr = torch.tensor([log_ratios], dtype=F64)
    lp = (torch.tensor([log_probs], dtype=F64) if log_probs is not None else lr - 1.0).requires_grad_(True)
    adv = torch.tensor([advantages], dtype=F64).expand_as(lr)
    out = compute_policy_loss(mode, lp, (lp - lr).detach(), adv, torch.ones_like(lr), clip_ratio_low=low,
                              clip_ratio_high=high, **params)
    out.token_loss.sum().backward()
    return out.token_loss.detach()[0].tolist(), lp.grad[0].tolist()


# ---------------------------------------------------------------- CISPO
def test_cispo_weights_log_pi_by_the_clipped_detached_ratio():
    # r = 1.5 > 1 + 0.2: the weight is 1.2, and the token still has a gradient (PPO's would be 0).
    loss, grad = run("cispo", [math.log(1.5)], [1.0], log_probs=[math.log(0.6)])
    assert loss == pytest.approx([-1.2 * math.log(0.6)]) and grad == pytest.approx([-1.2])
    # r = 1.1 inside the clip: the weight is r itself.
    loss, grad = run("cispo", [math.log(1.1)], [1.0], log_probs=[math.log(0.6)])
    assert grad == pytest.approx([-1.1])
    # A < 0 and r = 0.5 < 1 - 0.2: the weight is 0.8, the push down stays.
    _, grad = run("cispo", [math.log(0.5)], [-1.0], log_probs=[math.log(0.3)])
    assert grad == pytest.approx([0.8])


# ---------------------------------------------------------------- GMPO
def test_gmpo_clips_each_log_ratio_then_takes_the_geometric_mean():
    # A > 0, log r = (0.1, 0.5), clip 0.4: the second is cut to 0.4, mean 0.25, loss -e^0.25 on each token;
    # the clipped token has no gradient, the other 1/2 of the sequence's (the mean over 2 tokens).
    loss, grad = run("geo_mean", [0.1, 0.5], [1.0], low=0.4, high=0.4)
    assert loss == pytest.approx([-math.exp(0.25)] * 2)
    assert grad == pytest.approx([2 * -math.exp(0.25) / 2, 0.0])  # summed over the 2 tokens' copies
    # Nothing clipped: mean 0.2, both tokens carry the gradient.
    loss, grad = run("geo_mean", [0.1, 0.3], [1.0], low=0.4, high=0.4)
    assert loss == pytest.approx([-math.exp(0.2)] * 2) and grad == pytest.approx([-math.exp(0.2)] * 2)


def test_gmpo_clips_on_the_pessimistic_side_for_a_negative_advantage():
    # A < 0: log r = -0.5 is cut to -0.4 (pushing it lower would gain), 0.1 is kept: mean -0.15.
    loss, grad = run("geo_mean", [-0.5, 0.1], [-1.0], low=0.4, high=0.4)
    assert loss == pytest.approx([math.exp(-0.15)] * 2)
    assert grad == pytest.approx([0.0, math.exp(-0.15)])


def test_gmpo_takes_is_weights_as_their_geometric_mean_per_response():
    lp = torch.zeros(1, 2, dtype=F64)
    weights = torch.tensor([[4.0, 1.0]], dtype=F64)  # geometric mean 2
    out = compute_policy_loss("geo_mean", lp, lp, torch.ones(1, 2, dtype=F64), torch.ones(1, 2),
                              clip_ratio_low=0.4, clip_ratio_high=0.4, rollout_is_weights=weights)
    assert out.token_loss[0].tolist() == pytest.approx([-2.0, -2.0])


# ---------------------------------------------------------------- SAPO
def sapo_gate(r, tau):
    return 4 / tau / (1 + math.exp(-tau * (r - 1)))


def test_sapo_at_ratio_one_is_the_plain_policy_gradient():
    # f(1) = 2 / tau and f'(1) = 1: loss -2 A / tau, gradient -A (dr / d log pi = r = 1).
    loss, grad = run("sapo", [0.0], [1.0], tau_pos=1.0, tau_neg=1.05)
    assert loss == pytest.approx([-2.0]) and grad == pytest.approx([-1.0])
    loss, grad = run("sapo", [0.0], [-1.0], tau_pos=1.0, tau_neg=1.05)
    assert loss == pytest.approx([2 / 1.05]) and grad == pytest.approx([1.0])


def test_sapo_gate_softens_far_from_one():
    # r = e^2, A > 0, tau 1: gate 4 sigmoid(r - 1); d/d log pi = 4 s (1 - s) r, where PPO's clip gives 0.
    r = math.exp(2.0)
    s = 1 / (1 + math.exp(-(r - 1)))
    loss, grad = run("sapo", [2.0], [1.0], tau_pos=1.0, tau_neg=1.05)
    assert loss == pytest.approx([-sapo_gate(r, 1.0)]) and grad == pytest.approx([-4 * s * (1 - s) * r])
    assert abs(grad[0]) < 0.05  # the gate has all but closed (1 at r = 1)


# ---------------------------------------------------------------- GPG
def test_gpg_is_minus_advantage_times_log_pi_whatever_the_ratio():
    for log_ratio in (0.0, 3.0):  # no ratio, no clip: far off-policy changes nothing
        loss, grad = run("gpg", [log_ratio], [2.0], log_probs=[math.log(0.5)])
        assert loss == pytest.approx([-2.0 * math.log(0.5)]) and grad == pytest.approx([-2.0])


# ---------------------------------------------------------------- Clip-Cov and KL-Cov
# A = (3, -1, -1, -1) has mean 0; log pi = (0, -1, -1, -2) has mean -1: cov = A (log pi + 1) = (3, 0, 0, 1).
ADV, LOGP = [3.0, -1.0, -1.0, -1.0], [0.0, -1.0, -1.0, -2.0]


def cov_run(mode, log_ratios, **params):
    lp = torch.tensor([LOGP], dtype=F64, requires_grad=True)
    adv = torch.tensor([ADV], dtype=F64)
    out = compute_policy_loss(mode, lp, (lp - torch.tensor([log_ratios], dtype=F64)).detach(), adv,
                              torch.ones(1, 4), clip_ratio_low=0.2, clip_ratio_high=0.2, **params)
    out.token_loss.sum().backward()
    return out.token_loss.detach()[0].tolist(), lp.grad[0].tolist()


def test_clip_cov_drops_the_gradient_of_the_token_with_covariance_in_bounds():
    # Only token 0 has cov in (1, 5) (token 3's cov 1 is on the bound); 0.25 x 4 tokens = 1 token dropped.
    loss, grad = cov_run("clip_cov", [0.0] * 4, clip_cov_ratio=0.25, clip_cov_lb=1.0, clip_cov_ub=5.0)
    assert loss == pytest.approx([0.0, 1.0, 1.0, 1.0]) and grad == pytest.approx([0.0, 1.0, 1.0, 1.0])
    # Bounds no token's cov lies in: plain PPO, -A r with r = 1.
    loss, grad = cov_run("clip_cov", [0.0] * 4, clip_cov_ratio=0.25, clip_cov_lb=4.0, clip_cov_ub=5.0)
    assert loss == pytest.approx([-3.0, 1.0, 1.0, 1.0]) and grad == pytest.approx([-3.0, 1.0, 1.0, 1.0])


def test_kl_cov_penalises_the_top_covariance_token():
    # Token 0 (cov 3) gets + 0.1 |log r| with log r = 0.1: -3 e^0.1 + 0.01; its gradient -3 e^0.1 + 0.1.
    r = math.exp(0.1)
    loss, grad = cov_run("kl_cov", [0.1, 0.0, 0.0, 0.0], kl_cov_ratio=0.25, ppo_kl_coef=0.1)
    assert loss == pytest.approx([-3 * r + 0.01, 1.0, 1.0, 1.0])
    assert grad == pytest.approx([-3 * r + 0.1, 1.0, 1.0, 1.0])
    # On-policy (log r = 0) the penalty is 0: the plain -A r.
    loss, _ = cov_run("kl_cov", [0.0] * 4, kl_cov_ratio=0.25, ppo_kl_coef=0.1)
    assert loss == pytest.approx([-3.0, 1.0, 1.0, 1.0])


@pytest.mark.parametrize("mode", ["clip_cov", "kl_cov"])
def test_cov_losses_refuse_a_zero_share(mode):
    with pytest.raises(ValueError, match="must be > 0"):
        cov_run(mode, [0.0] * 4, **{f"{mode}_ratio": 0.0})
