"""Advantage estimators: hand-derived numbers, and vectorised vs plain-loop group statistics."""

from __future__ import annotations

import math
import statistics

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from logicrl.algos import ADV_ESTIMATORS, compute_advantage, masked_whiten, uids_to_index

EPS = 1e-6  # GRPO's epsilon, as compute_advantage's default


def outcome(scores, length=1, lengths=None):
    """Token-level rewards with each response's score on its last valid token, and the mask."""
    lengths = lengths or [length] * len(scores)
    T = max(lengths)
    rewards = torch.zeros(len(scores), T, dtype=torch.float64)
    mask = torch.zeros(len(scores), T, dtype=torch.bool)
    for i, (s, n) in enumerate(zip(scores, lengths)):
        mask[i, :n] = True
        if n:
            rewards[i, n - 1] = s
    return rewards, mask


# ---------------------------------------------------------------- grpo / Dr. GRPO
def test_grpo_uses_the_unbiased_std_like_verl():
    rewards, mask = outcome([1.0, 0.0, 0.0, 1.0])
    adv, returns = compute_advantage("grpo", rewards, mask, index=torch.tensor([5, 5, 5, 5]))
    # mean 0.5, unbiased std sqrt(1/3): 0.5 / sqrt(1/3) = 0.866 (the biased std, 0.5, would give 1).
    expected = 0.5 / (math.sqrt(1 / 3) + EPS)
    torch.testing.assert_close(adv[:, 0], torch.tensor([1, -1, -1, 1], dtype=torch.float64) * expected)
    assert abs(expected - 0.866) < 1e-3
    torch.testing.assert_close(returns, adv)


def test_dr_grpo_does_not_divide_by_std():
    rewards, mask = outcome([1.0, 0.0, 0.0, 1.0])
    adv, _ = compute_advantage("grpo", rewards, mask, index=torch.tensor([0, 0, 0, 0]), norm_adv_by_std_in_grpo=False)
    torch.testing.assert_close(adv[:, 0], torch.tensor([0.5, -0.5, -0.5, 0.5], dtype=torch.float64))


def test_grpo_groups_by_uid_not_by_position():
    # Interleaved groups: 7 -> scores {3, 1}, 2 -> scores {0, 0}. Ids need not be 0..G-1.
    rewards, mask = outcome([3.0, 0.0, 1.0, 0.0])
    adv, _ = compute_advantage("grpo", rewards, mask, index=torch.tensor([7, 2, 7, 2]),
                               norm_adv_by_std_in_grpo=False)
    torch.testing.assert_close(adv[:, 0], torch.tensor([1.0, 0.0, -1.0, 0.0], dtype=torch.float64))


def test_grpo_puts_the_advantage_on_valid_tokens_only():
    rewards, mask = outcome([1.0, 0.0], lengths=[3, 1])
    adv, _ = compute_advantage("grpo", rewards, mask, index=torch.tensor([0, 0]), norm_adv_by_std_in_grpo=False)
    torch.testing.assert_close(adv, torch.tensor([[0.5, 0.5, 0.5], [-0.5, 0.0, 0.0]], dtype=torch.float64))


@pytest.mark.parametrize("estimator", ["grpo", "rloo", "reinforce_plus_plus_baseline"])
def test_constant_and_singleton_groups_get_exactly_zero(estimator):
    # In float32 the mean of three 0.9s is 0.9 - 6e-8: divided by (std + eps) that residue would be
    # an advantage of ~0.06 (grpo), and batch whitening would blow it up to ~1 (rpp-baseline).
    rewards, mask = outcome([0.9, 0.9, 0.9, 0.7], length=2)
    rewards = rewards.float()
    adv, _ = compute_advantage(estimator, rewards, mask, index=torch.tensor([0, 0, 0, 1]))
    assert torch.equal(adv, torch.zeros_like(adv))


def test_uids_to_index_maps_hashables_to_group_ids():
    index = uids_to_index(["b", "a", "b", "c", "a"])
    assert index.tolist() == [0, 1, 0, 2, 1]
    rewards, mask = outcome([1.0, 0.0, 0.0, 2.0, 1.0])
    by_str, _ = compute_advantage("grpo", rewards, mask, index=index)
    by_int, _ = compute_advantage("grpo", rewards, mask, index=torch.tensor([9, 4, 9, 1, 4]))
    torch.testing.assert_close(by_str, by_int)


# ---------------------------------------------------------------- rloo
def test_rloo_subtracts_the_mean_of_the_other_responses():
    rewards, mask = outcome([1.0, 0.0, 0.0, 1.0, 3.0, 0.0, 0.0])
    adv, _ = compute_advantage("rloo", rewards, mask, index=torch.tensor([0, 0, 0, 0, 1, 1, 1]))
    # Group 0: 1 - mean(0, 0, 1) = 2/3, 0 - mean(1, 0, 1) = -2/3. Group 1: 3 - 0 = 3, 0 - mean(3, 0) = -1.5.
    expected = torch.tensor([2 / 3, -2 / 3, -2 / 3, 2 / 3, 3.0, -1.5, -1.5], dtype=torch.float64)
    torch.testing.assert_close(adv[:, 0], expected)


# ---------------------------------------------------------------- gae
def test_gae_with_gamma_lambda_one_is_returns_minus_values():
    rewards = torch.tensor([[0.0, 0.0, 1.0], [0.5, 2.0, 0.0]], dtype=torch.float64)
    values = torch.tensor([[0.2, 0.4, 0.9], [1.0, -1.0, 0.3]], dtype=torch.float64)
    mask = torch.tensor([[1, 1, 1], [1, 1, 0]], dtype=torch.bool)
    adv, returns = compute_advantage("gae", rewards, mask, values=values, gamma=1.0, lam=1.0)
    # With gamma = lam = 1 the TD errors telescope: A_t = sum_{k>=t} r_k - V_t, so returns are the
    # undiscounted rewards-to-go.
    reward_to_go = torch.tensor([[1.0, 1.0, 1.0], [2.5, 2.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(returns, reward_to_go)
    torch.testing.assert_close(adv, masked_whiten(returns - values, mask))


def test_gae_by_hand_three_tokens():
    rewards = torch.tensor([[0.0, 0.0, 1.0]], dtype=torch.float64)
    values = torch.tensor([[0.5, 0.4, 0.6]], dtype=torch.float64)
    mask = torch.ones(1, 3, dtype=torch.bool)
    adv, returns = compute_advantage("gae", rewards, mask, values=values, gamma=0.9, lam=0.8)
    # delta_2 = 1 - 0.6 = 0.4                      A_2 = 0.4
    # delta_1 = 0.9 * 0.6 - 0.4 = 0.14             A_1 = 0.14 + 0.72 * 0.4 = 0.428
    # delta_0 = 0.9 * 0.4 - 0.5 = -0.14            A_0 = -0.14 + 0.72 * 0.428 = 0.16816
    raw = torch.tensor([0.16816, 0.428, 0.4], dtype=torch.float64)
    torch.testing.assert_close(returns[0], raw + values[0])
    whitened = (raw - raw.mean()) / torch.sqrt(raw.var(unbiased=True) + 1e-8)
    torch.testing.assert_close(adv[0], whitened)


def test_gae_without_std_only_centres_and_keeps_the_scale_of_a_nearly_constant_batch():
    # Four one-token responses, V = 0: three score 0.5, one scores -1.5 (a nearly solved batch).
    rewards = torch.tensor([[0.5], [0.5], [0.5], [-1.5]], dtype=torch.float64)
    values = torch.zeros_like(rewards)
    mask = torch.ones(4, 1, dtype=torch.bool)
    adv, returns = compute_advantage("gae", rewards, mask, values=values, gamma=1.0, lam=0.95,
                                     norm_adv_by_std_in_gae=False)
    # mean 0: [0.5, 0.5, 0.5, -1.5]; unchanged returns.
    torch.testing.assert_close(adv[:, 0], torch.tensor([0.5, 0.5, 0.5, -1.5], dtype=torch.float64))
    torch.testing.assert_close(returns, rewards)
    # Whitened: var (unbiased) = (3 * 0.25 + 2.25) / 3 = 1, so the same numbers here. With 127 right
    # answers and one wrong: mean 62 / 128 = 0.484375, the wrong one's deviation -1.984375, the right
    # ones' 0.015625; unbiased var = (127 * 0.015625^2 + 1.984375^2) / 127 = 3.96875 / 127 = 0.03125,
    # so whitening gives the wrong one -1.984375 / 0.1768 = -11.23 where centring keeps -1.98.
    many = torch.full((128, 1), 0.5, dtype=torch.float64)
    many[-1] = -1.5
    kw = dict(values=torch.zeros_like(many), gamma=1.0, lam=1.0)
    whitened, _ = compute_advantage("gae", many, torch.ones_like(many, dtype=torch.bool), **kw)
    centred, _ = compute_advantage("gae", many, torch.ones_like(many, dtype=torch.bool), **kw,
                                   norm_adv_by_std_in_gae=False)
    assert whitened[-1, 0].item() == pytest.approx(-1.984375 / (0.03125 + 1e-8) ** 0.5, rel=1e-9)
    assert centred[-1, 0].item() == pytest.approx(-1.984375, rel=1e-12)
    assert centred[0, 0].item() == pytest.approx(0.015625, rel=1e-12)


def test_gae_carries_across_a_hole_in_the_mask():
    # Tool output in the middle of a response is masked; the recursion links the tokens either side,
    # so the row equals the same row with the hole cut out.
    rewards = torch.tensor([[0.3, 9.0, 1.0]], dtype=torch.float64)
    values = torch.tensor([[0.5, 9.0, 0.6]], dtype=torch.float64)
    mask = torch.tensor([[1, 0, 1]], dtype=torch.bool)
    _, returns = compute_advantage("gae", rewards, mask, values=values, gamma=0.9, lam=0.8)
    _, compact = compute_advantage("gae", rewards[:, [0, 2]], torch.ones(1, 2, dtype=torch.bool),
                                   values=values[:, [0, 2]], gamma=0.9, lam=0.8)
    torch.testing.assert_close(returns[:, [0, 2]], compact)
    assert returns[0, 1] == 0


# ---------------------------------------------------------------- reinforce++
def test_reinforce_plus_plus_discounts_then_whitens_under_the_mask():
    rewards = torch.tensor([[0.0, 0.0, 1.0], [1.0, 5.0, 5.0]], dtype=torch.float64)  # 5.0s are padding
    mask = torch.tensor([[1, 1, 1], [1, 0, 0]], dtype=torch.bool)
    adv, returns = compute_advantage("reinforce_plus_plus", rewards, mask, gamma=0.5)
    torch.testing.assert_close(returns, torch.tensor([[0.25, 0.5, 1.0], [1.0, 0.0, 0.0]], dtype=torch.float64))
    # Valid returns {0.25, 0.5, 1, 1}: mean 0.6875, unbiased var 0.140625, std 0.375.
    expected = torch.tensor([[-7 / 6, -0.5, 5 / 6], [5 / 6, 0.0, 0.0]], dtype=torch.float64)
    torch.testing.assert_close(adv, expected, atol=1e-6, rtol=0)


def test_reinforce_plus_plus_baseline_centres_by_group_then_whitens_by_batch():
    rewards, mask = outcome([1.0, 0.0, 1.0, 1.0])
    adv, returns = compute_advantage("reinforce_plus_plus_baseline", rewards, mask, index=torch.tensor([0, 0, 1, 1]))
    # Centred: [0.5, -0.5, 0, 0]; mean 0, unbiased std sqrt(0.5 / 3).
    std = math.sqrt(0.5 / 3)
    torch.testing.assert_close(adv[:, 0], torch.tensor([0.5 / std, -0.5 / std, 0.0, 0.0], dtype=torch.float64),
                               atol=1e-6, rtol=0)
    torch.testing.assert_close(returns, adv)


# ---------------------------------------------------------------- vectorised == loop
def loop_group_advantage(estimator, scores, uids, norm_by_std=True):
    """Plain-Python reference: one response at a time, groups found by uid in a dict."""
    groups: dict[int, list[float]] = {}
    for s, u in zip(scores, uids):
        groups.setdefault(u, []).append(s)
    out = []
    for s, u in zip(scores, uids):
        peers = groups[u]
        if len(set(peers)) == 1:  # constant group (includes a group of one)
            out.append(0.0)
        elif estimator == "grpo":
            centred = s - statistics.fmean(peers)
            out.append(centred / (statistics.stdev(peers) + EPS) if norm_by_std else centred)
        elif estimator == "rloo":
            out.append(s - (sum(peers) - s) / (len(peers) - 1))
        else:  # reinforce_plus_plus_baseline, before the batch whitening
            out.append(s - statistics.fmean(peers))
    return out


group_batches = st.lists(
    st.tuples(st.integers(0, 4), st.sampled_from([0.0, 0.5, 1.0, -1.0, 0.25])), min_size=1, max_size=12
)


@settings(max_examples=60, deadline=None)
@given(batch=group_batches, norm_by_std=st.booleans())
def test_vectorised_group_estimators_agree_with_the_loop(batch, norm_by_std):
    uids = [u for u, _ in batch]
    scores = [s for _, s in batch]
    rewards, mask = outcome(scores, length=2)
    index = torch.tensor(uids)
    grpo, _ = compute_advantage("grpo", rewards, mask, index=index, norm_adv_by_std_in_grpo=norm_by_std)
    torch.testing.assert_close(grpo[:, 0], torch.tensor(loop_group_advantage("grpo", scores, uids, norm_by_std),
                                                        dtype=torch.float64))
    rloo, _ = compute_advantage("rloo", rewards, mask, index=index)
    expected_rloo = torch.tensor(loop_group_advantage("rloo", scores, uids), dtype=torch.float64)
    torch.testing.assert_close(rloo[:, 1], expected_rloo)
    rppb, _ = compute_advantage("reinforce_plus_plus_baseline", rewards, mask, index=index)
    centred = torch.tensor(loop_group_advantage("reinforce_plus_plus_baseline", scores, uids), dtype=torch.float64)
    torch.testing.assert_close(rppb, masked_whiten(centred[:, None].expand(mask.shape), mask))


@pytest.mark.parametrize("estimator", sorted(ADV_ESTIMATORS))
def test_every_estimator_runs_through_the_dispatcher(estimator):
    rewards, mask = outcome([1.0, 0.0, 2.0], lengths=[3, 2, 1])
    adv, returns = compute_advantage(estimator, rewards, mask, index=torch.tensor([0, 0, 1]),
                                     values=torch.full(mask.shape, 0.5, dtype=torch.float64), gamma=0.99, lam=0.95)
    assert adv.shape == returns.shape == mask.shape
    assert torch.isfinite(adv).all() and torch.isfinite(returns).all()
    assert (adv[~mask] == 0).all() and (returns[~mask] == 0).all()
