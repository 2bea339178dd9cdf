"""Property tests: masked positions never matter, degenerate groups stay finite, GRPO is centred."""

from __future__ import annotations

import math

import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from logicrl.algos import (
    ADV_ESTIMATORS,
    AGG_MODES,
    KL_ESTIMATORS,
    POLICY_LOSSES,
    agg_loss,
    apply_kl_penalty,
    approx_kl_metrics,
    compute_advantage,
    compute_policy_loss,
    kl_penalty,
    masked_stats,
    value_loss,
)

SETTINGS = settings(max_examples=40, deadline=None)
FIELDS = ("rewards", "values", "old_values", "log_probs", "old_log_probs", "ref_log_probs", "advantages", "entropy")
# Whatever padding holds: large numbers, infinities and nans included.
GARBAGE = [1e30, -1e30, math.inf, -math.inf, math.nan, 123.0, -7.5]


@st.composite
def batches(draw):
    """A [B, T] batch with an arbitrary mask (holes, empty rows) and a second copy whose masked
    positions hold garbage. Ids put responses in groups of 1..3."""
    B, T = draw(st.integers(1, 6)), draw(st.integers(1, 5))
    seed = draw(st.integers(0, 2**31 - 1))
    g = torch.Generator().manual_seed(seed)
    mask = torch.rand(B, T, generator=g) < draw(st.sampled_from([0.3, 0.7, 1.0]))
    data = {
        "rewards": torch.randint(0, 3, (B, T), generator=g).double() * 0.5,
        "values": torch.randn(B, T, generator=g, dtype=torch.float64),
        "old_values": torch.randn(B, T, generator=g, dtype=torch.float64),
        "log_probs": -torch.rand(B, T, generator=g, dtype=torch.float64) * 3,
        "old_log_probs": -torch.rand(B, T, generator=g, dtype=torch.float64) * 3,
        "ref_log_probs": -torch.rand(B, T, generator=g, dtype=torch.float64) * 3,
        "advantages": torch.randn(B, T, generator=g, dtype=torch.float64),
        "entropy": torch.rand(B, T, generator=g, dtype=torch.float64),
    }
    garbage = torch.tensor(GARBAGE, dtype=torch.float64)
    dirty = {}
    for name, x in data.items():
        noise = garbage[torch.randint(0, len(GARBAGE), (B, T), generator=g)]
        dirty[name] = torch.where(mask, x, noise)
    index = torch.randint(0, max(1, B // 2), (B,), generator=g)
    return mask, index, data, dirty


def everything(mask, index, d):
    """Every function's outputs on one batch, gradients of the aggregated losses included."""
    out = {}
    for name in sorted(ADV_ESTIMATORS):
        out[f"adv/{name}"] = compute_advantage(name, d["rewards"], mask, index=index, values=d["values"],
                                               gamma=0.9, lam=0.8)
    for kl_type in sorted(KL_ESTIMATORS):
        out[f"kl/{kl_type}"] = kl_penalty(d["log_probs"], d["ref_log_probs"], mask, kl_type)
    out["kl_reward"] = apply_kl_penalty(d["rewards"], d["old_log_probs"], d["ref_log_probs"], mask, 0.1, "low_var_kl")
    out["value_loss"] = value_loss(d["values"], d["old_values"], d["rewards"], mask, 0.2)
    for loss_mode in sorted(POLICY_LOSSES):
        log_probs = d["log_probs"].clone().requires_grad_()
        torch.manual_seed(0)  # clip_cov drops a random share of its candidates: the same draw on both copies
        pg = compute_policy_loss(loss_mode, log_probs, d["old_log_probs"], d["advantages"], mask,
                                 clip_ratio_low=0.2, clip_ratio_high=0.28, clip_ratio_c=3.0)
        out[f"pg/{loss_mode}"] = pg
        out[f"metrics/{loss_mode}"] = pg.metrics
        for mode in sorted(AGG_MODES):
            loss = agg_loss(pg.token_loss, mask, mode, max_response_length=5)
            (grad,) = torch.autograd.grad(loss, log_probs, retain_graph=True)
            out[f"agg/{loss_mode}/{mode}"] = (loss.detach(), grad)
    out["approx_kl"] = approx_kl_metrics(d["log_probs"], d["old_log_probs"], mask)
    out["stats"] = masked_stats(d["advantages"], mask, "x")
    return out


def flatten(tree, prefix=""):
    if isinstance(tree, torch.Tensor):
        return {prefix: tree.detach()}
    items = tree.items() if isinstance(tree, dict) else enumerate(tree)
    return {k: v for key, sub in items for k, v in flatten(sub, f"{prefix}/{key}").items()}


@SETTINGS
@given(batch=batches())
def test_masked_positions_never_change_any_result(batch):
    mask, index, clean, dirty = batch
    a, b = flatten(everything(mask, index, clean)), flatten(everything(mask, index, dirty))
    for key in a:
        # Bitwise equal and finite: garbage is replaced before any arithmetic touches it.
        assert torch.isfinite(a[key]).all(), key
        assert torch.equal(a[key], b[key]), key


@SETTINGS
@given(batch=batches())
def test_gradients_never_reach_masked_positions(batch):
    mask, _, _, dirty = batch
    grads = {k: v for k, v in flatten(everything(mask, torch.zeros(mask.shape[0], dtype=torch.long), dirty)).items()
             if k.startswith("/agg/") and k.endswith("/1")}
    for key, grad in grads.items():
        assert (grad[~mask] == 0).all(), key
    assert len(grads) == len(POLICY_LOSSES) * len(AGG_MODES)


@SETTINGS
@given(reward=st.sampled_from([0.0, 1.0, -0.5, 0.1]), length=st.integers(1, 3), n_groups=st.integers(1, 3))
def test_degenerate_groups_are_finite_and_get_zero(reward, length, n_groups):
    # n = 2 responses per prompt with equal rewards; length 1 is the single-token response.
    B = 2 * n_groups
    mask = torch.zeros(B, 3, dtype=torch.bool)
    mask[:, :length] = True
    rewards = torch.zeros(B, 3)
    rewards[:, length - 1] = reward
    index = torch.arange(n_groups).repeat_interleave(2)
    for name in sorted(ADV_ESTIMATORS):
        adv, returns = compute_advantage(name, rewards, mask, index=index, values=torch.zeros(B, 3),
                                         gamma=1.0, lam=1.0)
        assert torch.isfinite(adv).all() and torch.isfinite(returns).all(), name
        if name in ("grpo", "rloo", "reinforce_plus_plus_baseline"):
            assert torch.equal(adv, torch.zeros_like(adv)), name


def test_a_single_single_token_response_is_finite_everywhere():
    mask, ones = torch.ones(1, 1, dtype=torch.bool), torch.ones(1, 1)
    for name in sorted(ADV_ESTIMATORS):
        adv, returns = compute_advantage(name, ones, mask, index=torch.zeros(1, dtype=torch.long), values=ones)
        assert torch.isfinite(adv).all() and torch.isfinite(returns).all(), name
    for loss_mode in sorted(POLICY_LOSSES):
        pg = compute_policy_loss(loss_mode, -ones, -ones, ones, mask, clip_ratio_low=0.2, clip_ratio_high=0.2)
        for mode in sorted(AGG_MODES):
            assert torch.isfinite(agg_loss(pg.token_loss, mask, mode, max_response_length=1))


@SETTINGS
@given(
    groups=st.lists(st.lists(st.floats(-5, 5, width=32), min_size=1, max_size=6), min_size=1, max_size=5),
    norm=st.booleans(),
)
def test_grpo_and_rloo_advantages_sum_to_zero_in_each_group(groups, norm):
    scores = torch.tensor([s for group in groups for s in group], dtype=torch.float64)
    index = torch.tensor([i for i, group in enumerate(groups) for _ in group])
    rewards, mask = scores[:, None], torch.ones(len(scores), 1, dtype=torch.bool)
    grpo, _ = compute_advantage("grpo", rewards, mask, index=index, norm_adv_by_std_in_grpo=norm)
    rloo, _ = compute_advantage("rloo", rewards, mask, index=index)
    for g in range(len(groups)):
        assert abs(grpo[index == g].sum().item()) < 1e-6
        assert abs(rloo[index == g].sum().item()) < 1e-6
