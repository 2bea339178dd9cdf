"""Each policy loss's metrics as verl defines them for that loss, and the losses at extreme log-ratios.

Most cases: 4 tokens, A = (1, -1, 1, -1), log r = (.5, .5, -.5, -.5), so r = (1.65, 1.65, .61, .61).
"""

from __future__ import annotations

import math

import pytest
import torch

from logicrl.algos import agg_loss, compute_policy_loss

F64 = torch.float64
ADV = [1.0, -1.0, 1.0, -1.0]
LR = [0.5, 0.5, -0.5, -0.5]


def run(mode, log_ratios=LR, advantages=ADV, low=0.2, high=0.28, **params):
    lr = torch.tensor([log_ratios], dtype=F64)
    lp = (lr - 1.0).requires_grad_(True)
    adv = torch.tensor([advantages], dtype=F64)
    out = compute_policy_loss(mode, lp, (lp - lr).detach(), adv, torch.ones_like(lr), clip_ratio_low=low,
                              clip_ratio_high=high, **params)
    return out, lp, {k.removeprefix("actor/"): v.item() for k, v in out.metrics.items()}


def test_vanilla_clip_fractions():
    # Token 0: A > 0, r > 1.28; token 3: A < 0, r < 0.8. No ratio reaches clip_ratio_c = 3.
    _, _, m = run("vanilla")
    assert m["pg_clipfrac"] == 0.5 and m["pg_clipfrac_high"] == 0.25 and m["pg_clipfrac_low"] == 0.25
    assert m["pg_clipfrac_lower"] == 0 and m["ppo_kl"] == pytest.approx(0.0)


def test_cispo_counts_every_clipped_weight_whatever_the_advantage():
    # All four weights are clipped (1.65 > 1.28, .61 < .8): verl's 1.0, not PPO's A-sided 0.5.
    _, _, m = run("cispo")
    assert m["pg_clipfrac"] == 1.0 and m["pg_clipfrac_lower"] == 0


def test_geo_mean_clips_in_log_space_and_splits_by_the_advantage_sign():
    # Bounds 0.4 in log space: every |log r| = .5 is clipped; A > 0 on two tokens, A < 0 on two.
    _, _, m = run("geo_mean", low=0.4, high=0.4)
    assert m["pg_clipfrac"] == 0.5 and m["pg_clipfrac_lower"] == 0.5


def test_sapo_has_no_clip():
    _, _, m = run("sapo", tau_pos=1.0, tau_neg=1.05)
    assert m["pg_clipfrac"] == 0 and m["pg_clipfrac_lower"] == 0


def test_kl_cov_reports_the_mean_absolute_log_ratio():
    _, _, m = run("kl_cov", kl_cov_ratio=0.25)
    assert m == {"ppo_kl": 0.5}


def test_clip_cov_reports_the_share_it_detached():
    # On-policy, 12 tokens, clip_cov_ratio 0.2: int(2.4) = 2 tokens lose their gradient, 2/12 (PPO clips none).
    torch.manual_seed(0)
    adv = [1.0, -1.0, 0.5, 2.0] * 3
    out, lp, m = run("clip_cov", [0.0] * 12, adv, clip_cov_ratio=0.2, clip_cov_lb=-100.0, clip_cov_ub=100.0)
    assert m["pg_clipfrac"] == pytest.approx(2 / 12) and m["pg_clipfrac_high"] == 0 == m["pg_clipfrac_low"]
    out.token_loss.sum().backward()
    assert int((lp.grad == 0).sum()) == 2


def test_gpg_reports_ppo_kl_only():
    _, _, m = run("gpg", [0.2, -0.4], [1.0, 1.0])
    assert m == {"ppo_kl": pytest.approx(0.1)}


@pytest.mark.parametrize("mode", ["vanilla", "cispo", "sapo"])
def test_ppo_kl_of_the_clamped_log_ratio_where_the_loss_clamps(mode):
    # verl clamps vanilla's, cispo's and sapo's log-ratio at +-20 and reports ppo_kl of the clamped one.
    _, _, m = run(mode, [25.0], [1.0])
    assert m["ppo_kl"] == -20.0


@pytest.mark.parametrize("mode", ["gspo", "geo_mean", "clip_cov"])
def test_ppo_kl_of_the_raw_log_ratio_where_verl_does_not_clamp(mode):
    _, _, m = run(mode, [25.0], [1.0], clip_cov_ratio=0.5)
    assert m["ppo_kl"] == -25.0


# ---------------------------------------------------------------- extreme log-ratios
def test_gspo_clamps_the_log_ratio_at_ten_as_verl():
    # Mean log r 12, A = -1: the ratio is e^10 = 22026 and the response gets no gradient (before: e^12, e^12 / 2).
    out, lp, _ = run("gspo", [12.0, 12.0], [-1.0, -1.0], low=3e-4, high=4e-4)
    loss = agg_loss(out.token_loss, torch.ones(1, 2), "seq-mean-token-mean")
    loss.backward()
    assert loss.item() == pytest.approx(math.exp(10)) and lp.grad.abs().max().item() == 0


@pytest.mark.parametrize("mode", ["clip_cov", "kl_cov", "geo_mean"])
def test_clamped_at_twenty_where_verl_is_not(mode):
    # The documented departure (docs/losses.md): at log r = 25, A = -1 verl's loss is e^25 = 7.2e10 with its
    # gradient; here it is e^20 = 4.85e8 and the token has no gradient, as in vanilla (verl's too).
    out, lp, _ = run(mode, [25.0], [-1.0], low=0.2, high=0.2, clip_cov_ratio=0.5, kl_cov_ratio=0.5,
                     clip_cov_lb=1e9)
    out.token_loss.sum().backward()
    expected = math.exp(20) + (0.1 * 20 if mode == "kl_cov" else 0.0)  # kl_cov adds ppo_kl_coef |log r|
    assert out.token_loss.item() == pytest.approx(expected) and lp.grad.item() == 0


def test_cispo_with_clip_ratio_low_ten_has_no_lower_clip():
    # verl's CISPO script: clip_ratio_low=10 puts the floor at -9. r = .61 keeps its weight, r = 1.65 is cut to 1.2.
    out, lp, m = run("cispo", LR, ADV, low=10.0, high=0.2)
    out.token_loss.sum().backward()
    r = [math.exp(x) for x in LR]
    assert lp.grad[0].tolist() == pytest.approx([-1.2, 1.2, -r[2], r[3]])
    assert m["pg_clipfrac"] == 0.5
