"""A token rollout correction rejects trains nothing in any policy loss, and enters no sequence ratio.

The hand case: 3 tokens, log r = (.05, .05, .3) against pi_old, A = 1; the engine's log-prob of token 2 is 2
below the trainer's, so token_k1 with bounds 0.5_2.0 rejects it (its ratio e^2 > 2).
"""

from __future__ import annotations

import math

import pytest
import torch

from logicrl.algos import POLICY_LOSSES, RolloutCorrection, agg_loss, apply_correction, compute_policy_loss
from logicrl.algos.rollout_correction import parse_rejection

F64 = torch.float64
PARAMS = {"clip_ratio_low": 0.4, "clip_ratio_high": 0.4, "clip_cov_ratio": 0.5, "clip_cov_lb": -100.0,
          "clip_cov_ub": 100.0, "kl_cov_ratio": 0.5}


def hand_case():
    old = torch.tensor([[-1.0, -1.2, -0.7]], dtype=F64)
    lp = (old + torch.tensor([[0.05, 0.05, 0.3]], dtype=F64)).requires_grad_(True)
    rollout = old - torch.tensor([[0.0, 0.0, 2.0]], dtype=F64)
    corr = RolloutCorrection(rejection=parse_rejection("token_k1", "0.5_2.0"))
    keep = apply_correction(old, rollout, torch.ones(1, 3), corr).keep
    assert keep.tolist() == [[True, True, False]]
    return lp, old, keep


def test_geo_mean_leaves_the_rejected_token_out_of_the_geometric_mean():
    # The response's ratio is e^mean(.05, .05) = e^.05: loss -1.05127 (verl's); each kept token gets half its
    # gradient, -e^.05 / 2 = -.526, and the rejected one none (before: -0.76175 and -.254 on all three).
    lp, old, keep = hand_case()
    out = compute_policy_loss("geo_mean", lp, old, torch.ones(1, 3, dtype=F64), torch.ones(1, 3), keep=keep,
                              **PARAMS)
    loss = agg_loss(torch.where(keep, out.token_loss, 0.0), torch.ones(1, 3), "seq-mean-token-mean")
    loss.backward()
    assert loss.item() == pytest.approx(-math.exp(0.05)) == pytest.approx(-1.05127, abs=1e-5)
    assert lp.grad[0].tolist() == pytest.approx([-math.exp(0.05) / 2] * 2 + [0.0])
    assert lp.grad[0, 2].item() == 0.0


def test_gspo_sequence_ratio_excludes_the_rejected_token():
    # s = e^.05 (not e^.1333 with the rejected token's .3); each kept token carries s, the rejected one 0.
    lp, old, keep = hand_case()
    out = compute_policy_loss("gspo", lp, old, torch.ones(1, 3, dtype=F64), torch.ones(1, 3), keep=keep,
                              clip_ratio_low=0.5, clip_ratio_high=0.5)
    s = math.exp(0.05)
    assert out.ratio[0, :2].tolist() == pytest.approx([s, s])
    assert out.token_loss[0].tolist() == pytest.approx([-s, -s, 0.0])
    # Aggregated over the whole response (the rejected token keeps its place in the normaliser): -2s/3, the
    # gradient s/3 per kept token; with verl's normaliser (the kept tokens) it would be -s and s/2.
    loss = agg_loss(out.token_loss, torch.ones(1, 3), "seq-mean-token-mean")
    loss.backward()
    assert loss.item() == pytest.approx(-2 * s / 3)
    assert lp.grad[0].tolist() == pytest.approx([-s / 3, -s / 3, 0.0])


def test_a_response_rejected_whole_trains_nothing_in_geo_mean():
    lp = torch.tensor([[-1.0, -1.0], [-0.5, -0.7]], dtype=F64, requires_grad=True)
    keep = torch.tensor([[False, False], [True, True]])
    out = compute_policy_loss("geo_mean", lp, lp.detach() - 0.1, torch.ones(2, 2, dtype=F64), torch.ones(2, 2),
                              keep=keep, **PARAMS)
    assert out.token_loss[0].tolist() == [0.0, 0.0]
    agg_loss(out.token_loss, torch.ones(2, 2), "token-mean").backward()
    assert lp.grad[0].tolist() == [0.0, 0.0] and (lp.grad[1] != 0).all()


def batch(seed):
    g = torch.Generator().manual_seed(seed)
    mask = torch.tensor([[1, 1, 1, 1, 0], [0, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 1, 1, 1, 1]], dtype=torch.bool)
    keep = mask.clone()
    keep[0, 1] = keep[1, 3] = keep[3, 0] = keep[3, 4] = False  # rejected tokens, one per row but row 2
    old = -torch.rand(4, 5, generator=g, dtype=F64) * 2
    lp = old + 0.3 * torch.randn(4, 5, generator=g, dtype=F64)
    adv = torch.randn(4, 1, generator=g, dtype=F64).expand(4, 5).clone()
    weights = 0.5 + torch.rand(4, 5, generator=g, dtype=F64)
    return mask, keep, lp, old, adv, weights


def loss_and_grad(mode, mask, keep, lp, old, adv, weights, agg):
    lp = lp.clone().requires_grad_(True)
    torch.manual_seed(0)  # clip_cov's random pick: the same draw every call
    out = compute_policy_loss(mode, lp, old, adv, mask, keep=keep, rollout_is_weights=weights, **PARAMS)
    token_loss = torch.where(keep, out.token_loss, 0.0)  # the actor zeros a rejected token's other terms too
    loss = agg_loss(token_loss, mask, agg, max_response_length=5)
    loss.backward()
    return loss.detach(), lp.grad, out


@pytest.mark.parametrize("agg", ["token-mean", "seq-mean-token-mean"])
@pytest.mark.parametrize("mode", sorted(POLICY_LOSSES))
def test_a_rejected_token_has_no_gradient_and_its_values_change_nothing(mode, agg):
    mask, keep, lp, old, adv, weights = batch(1)
    loss, grad, out = loss_and_grad(mode, mask, keep, lp, old, adv, weights, agg)
    rejected = mask & ~keep
    assert (grad[rejected] == 0).all(), grad
    assert (grad[keep] != 0).any()
    # Any log-probs, old log-probs, advantages and IS weights at the rejected tokens: the same loss, gradient and
    # metrics to the bit, so none of their values is in a sequence ratio, a mean or a covariance.
    far = torch.where(rejected, torch.full_like(lp, 3.0), 0.0)
    loss2, grad2, out2 = loss_and_grad(mode, mask, keep, lp + far, old - far, adv + far, weights + far, agg)
    assert torch.equal(loss, loss2) and torch.equal(grad, grad2)
    assert torch.equal(out.token_loss, out2.token_loss)
    assert {k: v.item() for k, v in out.metrics.items()} == {k: v.item() for k, v in out2.metrics.items()}


@pytest.mark.parametrize("mode", sorted(POLICY_LOSSES))
def test_nothing_rejected_is_the_loss_without_correction(mode):
    mask, _, lp, old, adv, _ = batch(2)
    torch.manual_seed(0)
    plain = compute_policy_loss(mode, lp, old, adv, mask, **PARAMS)
    torch.manual_seed(0)
    kept = compute_policy_loss(mode, lp, old, adv, mask, keep=mask.clone(), **PARAMS)
    assert torch.equal(plain.token_loss, kept.token_loss)
