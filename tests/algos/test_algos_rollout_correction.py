"""Rollout correction: IS weights, rejection, the mismatch metrics, and what they do to a loss.

Numbers derived by hand from the ratios r = pi_trainer / pi_rollout chosen per token; the last tests
take exact expectations over every response of a tiny policy, so "corrects the mismatch" is an
equality, not a sampled estimate.
"""

from __future__ import annotations

import itertools
import math

import pytest
import torch

from logicrl.algos import (
    POLICY_LOSSES,
    RolloutCorrection,
    apply_correction,
    compute_policy_loss,
    mismatch_metrics,
    parse_rejection,
)
from logicrl.algos.rollout_correction import RejectRule, is_weights, rejection_mask

F64 = torch.float64


def logs(*rows):
    return torch.tensor([[math.log(r) for r in row] for row in rows], dtype=F64)


def close(tensor, expected):
    torch.testing.assert_close(tensor, torch.tensor(expected, dtype=tensor.dtype))


def values(metrics):
    return {k.removeprefix("rollout_corr/"): float(v) for k, v in metrics.items()}


# ---------------------------------------------------------------- IS weights
def test_token_weights_are_truncated_at_the_threshold():
    mask = torch.tensor([[1, 1, 1, 0]])
    w, m = is_weights(logs([0.25, 3.0, 1.0, 7.0]), mask, "token", 2.0)
    close(w, [[0.25, 2.0, 1.0, 0.0]])  # 3 cut to 2; the padded 7 is 0
    m = values(m)
    # Mean and max of the weights applied, after truncation (verl's, since its PR 5722).
    assert m["rollout_is_mean"] == pytest.approx(3.25 / 3) and m["rollout_is_max"] == pytest.approx(2.0)
    assert m["rollout_is_ratio_fraction_high"] == pytest.approx(1 / 3)  # truncated
    assert m["rollout_is_ratio_fraction_low"] == pytest.approx(1 / 3)  # 0.25 < 1 / 2


def test_token_weights_inside_the_threshold_are_the_ratios():
    w, m = is_weights(logs([1.5, 0.8]), torch.ones(1, 2), "token", 2.0)
    close(w, [[1.5, 0.8]])
    assert values(m)["rollout_is_ratio_fraction_high"] == 0


def test_sequence_weights_are_the_product_per_response():
    # Row 1: 2 x 1.5 = 3, cut to 2; row 2: 0.5 x 1.2 = 0.6, kept. The mean is over tokens of the truncated
    # weights, the max the untruncated product, the fractions count responses (verl's definitions).
    w, m = is_weights(logs([2.0, 1.5], [0.5, 1.2]), torch.ones(2, 2), "sequence", 2.0)
    close(w, [[2.0, 2.0], [0.6, 0.6]])
    m = values(m)
    assert m["rollout_is_mean"] == pytest.approx(1.3) and m["rollout_is_max"] == pytest.approx(3.0)
    assert m["rollout_is_ratio_fraction_high"] == pytest.approx(0.5)


def test_token_metrics_are_of_the_truncated_weights():
    # log r = (ln 5, 0), threshold 2: weights (2, 1); verl reports mean 1.5 and max 2.0 (not 3.0 and 5.0).
    m = values(is_weights(logs([5.0, 1.0]), torch.ones(1, 2), "token", 2.0)[1])
    assert m["rollout_is_mean"] == pytest.approx(1.5) and m["rollout_is_max"] == pytest.approx(2.0)
    assert m["rollout_is_ratio_fraction_high"] == pytest.approx(0.5)


def test_sequence_mean_counts_a_response_once_per_token():
    # Rows of 4 and 1 tokens with log-ratio sums 1.0 and -0.2: weights min(e, 2) = 2 and e^-0.2;
    # (4 x 2 + e^-0.2) / 5 = 1.7637 (verl), not the per-response mean of untruncated weights, 1.7685.
    lr = torch.tensor([[0.25] * 4, [-0.2, 0, 0, 0]], dtype=F64)
    mask = torch.tensor([[1, 1, 1, 1], [1, 0, 0, 0]])
    m = values(is_weights(lr, mask, "sequence", 2.0)[1])
    assert m["rollout_is_mean"] == pytest.approx((8 + math.exp(-0.2)) / 5) == pytest.approx(1.7637, abs=1e-4)
    assert m["rollout_is_max"] == pytest.approx(math.e)


def test_sequence_weights_come_from_the_valid_tokens_wherever_they_sit():
    # A hole at the start of row 1: mask [[0, 1, 1], [1, 1, 1]], log r = 0.1 a token (and junk where masked).
    # Weights e^0.2 = 1.2214 and e^0.3 = 1.3499, normaliser their mean 1.2856: 0.950 and 1.050 (verl).
    lr = torch.tensor([[9.0, 0.1, 0.1], [0.1, 0.1, 0.1]], dtype=F64)
    mask = torch.tensor([[0, 1, 1], [1, 1, 1]])
    w, m = is_weights(lr, mask, "sequence", 2.0, batch_normalize=True)
    norm = (math.exp(0.2) + math.exp(0.3)) / 2
    assert norm == pytest.approx(1.2856, abs=1e-4)
    close(w, [[0.0, math.exp(0.2) / norm, math.exp(0.2) / norm], [math.exp(0.3) / norm] * 3])
    assert w[0, 1].item() == pytest.approx(0.950, abs=1e-3) and w[1, 0].item() == pytest.approx(1.050, abs=1e-3)
    m = values(m)
    assert m["rollout_is_batch_norm_factor"] == pytest.approx(norm)
    assert m["rollout_is_mean"] == pytest.approx((2 * math.exp(0.2) + 3 * math.exp(0.3)) / 5)  # before normalising
    assert m["rollout_is_max"] == pytest.approx(math.exp(0.3))


def test_batch_normalize_divides_by_the_mean_after_truncation():
    w, m = is_weights(logs([1.0, 4.0]), torch.ones(1, 2), "token", 2.0, batch_normalize=True)
    close(w, [[2 / 3, 4 / 3]])  # (1, 2) / 1.5
    assert values(m)["rollout_is_batch_norm_factor"] == pytest.approx(1.5)


# ---------------------------------------------------------------- rejection
def keep_of(option, threshold, *rows, mask=None):
    mask = torch.ones(len(rows), len(rows[0])) if mask is None else mask
    keep, m = rejection_mask(logs(*rows), mask, parse_rejection(option, threshold))
    return keep.tolist(), values(m)


def test_token_k1_keeps_ratios_within_the_bounds():
    keep, m = keep_of("token_k1", "0.5_2.0", [0.4, 1.0, 2.5, 1.9])
    assert keep == [[False, True, False, True]]
    assert m["rollout_rs_masked_fraction"] == pytest.approx(0.5) and m["rollout_rs_seq_masked_fraction"] == 1.0
    keep, m = keep_of("token", 2.0, [0.6, 1.9])  # verl's old name; one number u means (1/u, u)
    assert keep == [[True, True]] and m["rollout_rs_masked_fraction"] == 0


def test_sequence_k1_rejects_whole_responses_by_the_product():
    # Row 1: 1.5 x 1.5 = 2.25 > 2 -> dropped; row 2: 1.2 x 0.9 = 1.08 -> kept.
    keep, m = keep_of("seq_sum_k1", "0.5_2.0", [1.5, 1.5], [1.2, 0.9])
    assert keep == [[False, False], [True, True]] and m["rollout_rs_seq_masked_fraction"] == pytest.approx(0.5)


def test_geometric_rejection_uses_the_geometric_mean_ratio():
    # Row 1: sqrt(1.44 x 1) = 1.2 > 1.1; row 2: sqrt(1.1 x 0.95) = 1.022.
    keep, _ = keep_of("geometric", "0.9_1.1", [1.44, 1.0], [1.1, 0.95])
    assert keep == [[False, False], [True, True]]
    keep, _ = keep_of("seq_mean_k1", "0.5_2.0", [1.44, 1.0], [1.1, 0.95])  # loose bounds: nothing rejected
    assert keep == [[True, True], [True, True]]


def test_k2_and_k3_rules_and_their_conjunction():
    # k2 = (ln r)^2 / 2: r = 1.2 gives 0.0166 <= 0.02 (kept), r = 1.25 gives 0.0249 (rejected).
    keep, _ = keep_of("token_k2", "0.02", [1.2, 1.25])
    assert keep == [[True, False]]
    # k3 = r - 1 - ln r: 1.1 gives 0.0047, 0.85 gives 0.0125 > 0.01, so seq_max drops row 1 whole.
    keep, _ = keep_of("seq_max_k3", "0.01", [1.1, 0.85], [1.1, 1.0])
    assert keep == [[False, False], [True, True]]
    # Both rules at once, one bound each: a token must pass both.
    keep, _ = keep_of("token_k2,seq_max_k3", "0.02,0.01", [1.1, 1.25], [1.1, 1.0])
    assert keep == [[False, False], [True, True]]


def test_padding_is_never_kept_nor_counted():
    mask = torch.tensor([[1, 1, 0]])
    keep, m = keep_of("token_k1", "0.5_2.0", [1.0, 1.0, 100.0], mask=mask)
    assert keep == [[True, True, False]] and m["rollout_rs_masked_fraction"] == 0


@pytest.mark.parametrize("option, threshold, needle", [
    ("token_k4", "1", "is not one of"),
    ("token_k1", None, "needs rollout_rs_threshold"),
    ("token_k1,seq_sum_k2", "1,2,3", "3 bounds for 2 options"),
    ("token_k2", "0.5_2.0", "is not a bound for token_k2"),
    ("seq_mean_k3", "-1", "must be positive"),
])
def test_bad_rejection_specs_are_refused_naming_the_part(option, threshold, needle):
    with pytest.raises(ValueError, match=needle):
        parse_rejection(option, threshold)


def test_rejection_specs_parse_to_verls_rules():
    assert parse_rejection("token, geometric,token", "0.5_2.0, 0.99_1.01") == (
        RejectRule("token_k1", 0.5, 2.0), RejectRule("seq_mean_k1", 0.99, 1.01))
    assert parse_rejection("seq_sum_k1,token_k3", 4) == (RejectRule("seq_sum_k1", 0.25, 4.0),
                                                         RejectRule("token_k3", None, 4.0))
    assert parse_rejection(None, None) == ()


# ---------------------------------------------------------------- the mismatch metrics
def test_mismatch_metrics_by_hand():
    # Trainer (0.5, 0.25), engine (0.25, 0.25): log r = (ln 2, 0).
    m = values(mismatch_metrics(logs([0.5, 0.25]), logs([0.25, 0.25]), torch.ones(1, 2)))
    ln2 = math.log(2)
    assert m["kl"] == pytest.approx(-ln2 / 2) and m["k3_kl"] == pytest.approx((1 - ln2) / 2)
    assert m["log_ppl_diff"] == pytest.approx(-0.5 * ln2)  # mean log pi: engine -2 ln 2, trainer -1.5 ln 2
    assert m["training_log_ppl"] == pytest.approx(1.5 * ln2) and m["rollout_log_ppl"] == pytest.approx(2 * ln2)
    assert m["chi2_token"] == pytest.approx((4 + 1) / 2 - 1)


def test_k3_kl_is_not_clamped():
    # log r = 25: k3 = e^25 - 26 = 7.2e10 as verl reports it (a clamp at 20 would give 4.85e8).
    m = values(mismatch_metrics(torch.tensor([[25.0]]), torch.zeros(1, 1), torch.ones(1, 1)))
    assert m["k3_kl"] == pytest.approx(math.exp(25) - 26, rel=1e-6)


def test_off_still_reports_the_weights_but_applies_nothing():
    out = apply_correction(logs([3.0, 1.0]), logs([1.0, 1.0]), torch.ones(1, 2), RolloutCorrection(rollout_is=None))
    assert out.weights is None and out.keep.all()
    assert values(out.metrics)["rollout_is_ratio_fraction_high"] == pytest.approx(0.5)  # what TIS at 2 would cut


def test_bypass_with_ppo_clip_does_not_weight_twice():
    corr = RolloutCorrection(rollout_is="token", bypass_mode=True)
    assert not corr.reweights
    assert RolloutCorrection(rollout_is="token", bypass_mode=True, loss_type="reinforce").reweights


# ---------------------------------------------------------------- what it does to the loss
LOSS_PARAMS = {"clip_ratio_low": 0.2, "clip_ratio_high": 0.2, "clip_cov_ratio": 0.5, "clip_cov_lb": -100.0,
               "clip_cov_ub": 100.0, "kl_cov_ratio": 0.5}


@pytest.mark.parametrize("mode", sorted(POLICY_LOSSES))
def test_equal_policies_change_nothing(mode):
    torch.manual_seed(0)
    lp = torch.randn(3, 4, dtype=F64).clamp(max=-0.1)
    old = lp + 0.05 * torch.randn(3, 4, dtype=F64)
    adv, mask = torch.randn(3, 1, dtype=F64).expand(3, 4), torch.tensor([[1, 1, 1, 0], [1, 1, 0, 0], [1] * 4])
    corr = RolloutCorrection(rollout_is="sequence", rejection=parse_rejection("token,geometric", "0.5_2.0,0.99_1.01"))
    out = apply_correction(old, old, mask, corr)  # the engine's log-probs are the trainer's
    assert out.keep.tolist() == mask.bool().tolist() and out.weights[mask.bool()].eq(1).all()
    torch.manual_seed(1)  # clip_cov draws its tokens at random: the same draw both times
    plain = compute_policy_loss(mode, lp, old, adv, mask, **LOSS_PARAMS).token_loss
    torch.manual_seed(1)
    corrected = compute_policy_loss(mode, lp, old, adv, mask, rollout_is_weights=out.weights, **LOSS_PARAMS).token_loss
    torch.testing.assert_close(corrected, plain, rtol=0, atol=0)


def exact_gradients(mode, length, level, threshold, shift):
    """Exact expected gradients over every response of a position-wise policy on 3 tokens:
    (on-policy E_pi[grad L], corrected E_mu[grad L_w], uncorrected E_mu[grad L], the truncation's share),
    with mu the engine's policy, its logits shifted by `shift` (the planted mismatch). All 3^length
    responses form one batch; each response's summed token loss is weighted by its probability."""
    logits = torch.tensor([[0.3, -0.2, 0.5], [1.0, 0.0, -1.0]][:length], dtype=F64, requires_grad=True)
    engine = (logits + torch.tensor(shift[:length], dtype=F64)).detach()
    ys = torch.tensor(list(itertools.product(range(3), repeat=length)))  # [B, T]
    reward = ((ys * torch.arange(1, length + 1)).sum(-1) % 3).to(F64) - 1.0  # [B]
    positions = torch.arange(length)
    lp = torch.log_softmax(logits, -1)[positions, ys]  # [B, T]
    mask, adv = torch.ones_like(lp), reward[:, None].expand_as(lp)
    out = {}
    for name, sampler, correct in (("on", logits.detach(), False), ("corr", engine, True), ("raw", engine, False),
                                   ("cut", engine, "cut")):
        mu = torch.log_softmax(sampler, -1)[positions, ys]  # [B, T]
        weights = None
        if correct:
            corr = RolloutCorrection(rollout_is=level, rollout_is_threshold=threshold)
            c = apply_correction(lp.detach(), mu, mask, corr)
            weights = c.weights
            if correct == "cut":  # the mass truncation removed: (w - min(w, threshold))
                weights = is_weights(lp.detach() - mu, mask, level, 1e9)[0] - c.weights
        torch.manual_seed(0)  # clip_cov's random pick: the same tokens in every variant
        loss = compute_policy_loss(mode, lp, lp.detach(), adv, mask, rollout_is_weights=weights, **LOSS_PARAMS)
        expected = (mu.sum(-1).exp() * loss.token_loss.sum(-1)).sum()
        out[name] = torch.autograd.grad(expected, logits, retain_graph=True)[0]
    return out["on"], out["corr"], out["raw"], out["cut"]


SHIFT = [[0.4, -0.3, 0.0], [-0.2, 0.5, 0.1]]


@pytest.mark.parametrize("mode", sorted(POLICY_LOSSES))
def test_a_planted_mismatch_is_corrected_exactly_by_sequence_weights(mode):
    # Two tokens, sequence-level IS with a threshold no weight reaches: the corrected expectation under the
    # engine's policy is the on-policy one; without correction it is not.
    on, corr, raw, _ = exact_gradients(mode, 2, "sequence", 100.0, SHIFT)
    torch.testing.assert_close(corr, on, rtol=1e-9, atol=1e-12)
    assert (raw - on).abs().max() > 1e-2


def test_token_weights_correct_a_one_token_mismatch():
    on, corr, raw, _ = exact_gradients("vanilla", 1, "token", 100.0, SHIFT)
    torch.testing.assert_close(corr, on, rtol=1e-9, atol=1e-12)
    assert (raw - on).abs().max() > 1e-2


def test_with_truncation_the_gap_is_exactly_the_truncated_mass():
    on, corr, _, cut = exact_gradients("vanilla", 2, "sequence", 1.2, SHIFT)
    assert cut.abs().max() > 1e-3  # the threshold is active
    torch.testing.assert_close(corr + cut, on, rtol=1e-9, atol=1e-12)
