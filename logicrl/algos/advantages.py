"""Advantage estimators, chosen by `algorithm.adv_estimator` from ADV_ESTIMATORS.

Every estimator returns `(advantages, returns)`, both [B, T] with B = responses (prompts x rollout.n)
and T = response tokens, 0 at masked positions. They run once per step on the controller, under
no_grad, on the whole batch: whitening and group statistics need all of it.

Groups: `index` is a LongTensor [B], the id of the prompt each response answers (only equality
matters), so group statistics are a few vectorised scatter ops; `uids_to_index` turns verl-style uid
strings into one. Sequence-level estimators (grpo, rloo, reinforce_plus_plus_baseline) score a
response by the sum of its token-level rewards, so a KL penalty folded into the rewards counts too.

A response with no comparison (a group of one, or all scores equal) gets exactly 0 advantage, never
nan. verl gives a group of one its raw score (mean 0, std 1); we depart because a lone response carries
no relative signal, and an unbaselined score is REINFORCE, which exists here under its own name.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence

import torch

from logicrl import algo_names
from logicrl.algos.masked import as_bool_mask, masked_fill_zero, masked_mean, masked_sum, masked_whiten
from logicrl.algos.registry import Registry

# Everything compute_advantage can pass; an estimator declares the subset it uses.
ADV_ESTIMATORS = Registry(
    "algorithm.adv_estimator",
    inputs=("token_level_rewards", "response_mask", "index", "values", "gamma", "lam",
            "norm_adv_by_std_in_grpo", "norm_adv_by_std_in_gae", "epsilon"),
    names=algo_names.ADV_ESTIMATORS,
)
register_adv_estimator = ADV_ESTIMATORS.register


@torch.no_grad()
def compute_advantage(
    adv_estimator: str,
    token_level_rewards: torch.Tensor,  # [B, T]
    response_mask: torch.Tensor,  # [B, T]
    *,
    index: torch.Tensor | None = None,  # [B] prompt id per response (group estimators)
    values: torch.Tensor | None = None,  # [B, T] critic values (gae)
    gamma: float = 1.0,
    lam: float = 1.0,
    norm_adv_by_std_in_grpo: bool = True,
    norm_adv_by_std_in_gae: bool = True,
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:  # ([B, T], [B, T])
    """Advantages and returns by the estimator named `adv_estimator` (see ADV_ESTIMATORS)."""
    return ADV_ESTIMATORS.call(
        adv_estimator, token_level_rewards=token_level_rewards, response_mask=response_mask, index=index,
        values=values, gamma=gamma, lam=lam, norm_adv_by_std_in_grpo=norm_adv_by_std_in_grpo,
        norm_adv_by_std_in_gae=norm_adv_by_std_in_gae, epsilon=epsilon,
    )


def uids_to_index(uids: Sequence[Hashable], device: torch.device | str | None = None) -> torch.Tensor:
    """[B] LongTensor with one id per distinct uid (first seen gets 0), for `index=`."""
    ids: dict[Hashable, int] = {}
    return torch.tensor([ids.setdefault(uid, len(ids)) for uid in uids], dtype=torch.long, device=device)


def group_stats(scores: torch.Tensor, index: torch.Tensor) -> dict[str, torch.Tensor]:
    """Statistics of each response's group, gathered back per response: all [B].

    mean, std (unbiased, see grpo), size (float), and constant (bool: every score in the group is
    equal, which includes groups of one). `constant` is decided by comparing the group's max and
    min, not by std == 0: a mean of equal floats can differ from them by one rounding, and that
    residue over (std + eps) would be a small nonzero advantage instead of 0.
    """
    if index.shape != scores.shape:
        raise ValueError(
            f"index has shape {tuple(index.shape)}; need one prompt id per response, {tuple(scores.shape)}"
        )
    _, group = torch.unique(index, return_inverse=True)  # [B] in 0..G-1
    n_groups = int(group.max()) + 1 if group.numel() else 0
    zeros = scores.new_zeros(n_groups)
    size = zeros.index_add(0, group, torch.ones_like(scores))
    mean = zeros.index_add(0, group, scores) / size
    sq_dev = zeros.index_add(0, group, (scores - mean[group]) ** 2)
    # Unbiased, like verl (torch.std's default): GRPO runs and their hyperparameters carry over
    # unchanged. The biased std differs by sqrt(n / (n - 1)), a constant for a fixed rollout.n,
    # so the choice rescales advantages (1.155x at n = 4) rather than reorders them.
    std = (sq_dev / (size - 1).clamp(min=1)).sqrt()
    big = torch.finfo(scores.dtype).max
    gmax = scores.new_full((n_groups,), -big).scatter_reduce(0, group, scores, "amax")
    gmin = scores.new_full((n_groups,), big).scatter_reduce(0, group, scores, "amin")
    return {"mean": mean[group], "std": std[group], "size": size[group], "constant": (gmax == gmin)[group]}


def _per_token(seq_values: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B] -> [B, T]: the sequence's value on each of its tokens, 0 elsewhere."""
    return masked_fill_zero(seq_values[:, None].expand(mask.shape), mask)


def _scores(token_level_rewards: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    return masked_sum(token_level_rewards, mask, dim=-1)  # [B]


@register_adv_estimator("gae")
def gae_advantage(
    token_level_rewards: torch.Tensor,  # [B, T]
    values: torch.Tensor,  # [B, T]
    response_mask: torch.Tensor,  # [B, T]
    gamma: float,
    lam: float,
    norm_adv_by_std_in_gae: bool = True,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Generalised advantage estimation (Schulman et al. 2016, arXiv:1506.02438), as verl.

    delta_t = r_t + gamma V_{t+1} - V_t,  A_t = delta_t + gamma lam A_{t+1},  returns = A + V,
    with V after the last token = 0. Masked positions are skipped, not zeroed: the recursion carries
    over them, so a hole in the mask (tool output in a multi-turn response) links the tokens either
    side. The advantages are then whitened over all valid tokens of the batch (verl does too);
    `returns` are the critic's targets and stay unwhitened.

    norm_adv_by_std_in_gae=False only subtracts the batch mean. Whitening divides by the batch's std
    whatever it is, so once nearly every response earns the same score the noise between them, and a
    single wrong answer, come out at full scale: a batch of 127 right answers and one wrong one gives
    that one an advantage near -11 (Dr. GRPO's argument against the group std, at batch level).
    """
    mask = as_bool_mask(response_mask)
    rewards = masked_fill_zero(token_level_rewards, mask)
    values = masked_fill_zero(values, mask)
    next_value = values.new_zeros(values.shape[0])
    next_adv = values.new_zeros(values.shape[0])
    advantages = torch.zeros_like(values)
    # A loop over T vector ops: the closed form needs a [T, T] discount matrix per batch.
    for t in reversed(range(values.shape[1])):
        delta = rewards[:, t] + gamma * next_value - values[:, t]
        adv = delta + gamma * lam * next_adv
        next_adv = torch.where(mask[:, t], adv, next_adv)
        next_value = torch.where(mask[:, t], values[:, t], next_value)
        advantages[:, t] = next_adv
    returns = masked_fill_zero(advantages + values, mask)
    if not norm_adv_by_std_in_gae:
        return masked_fill_zero(advantages - masked_mean(advantages, mask), mask), returns
    return masked_whiten(advantages, mask), returns


@register_adv_estimator("grpo")
def grpo_advantage(
    token_level_rewards: torch.Tensor,  # [B, T]
    response_mask: torch.Tensor,  # [B, T]
    index: torch.Tensor,  # [B]
    norm_adv_by_std_in_grpo: bool = True,
    epsilon: float = 1e-6,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Group-relative advantage (GRPO: Shao et al. 2024, DeepSeekMath, arXiv:2402.03300).

    A_i = (s_i - mean(group)) / (std(group) + epsilon) on every token of response i, std unbiased
    (see group_stats). norm_adv_by_std_in_grpo=False gives Dr. GRPO's A_i = s_i - mean(group)
    (Liu et al. 2025, arXiv:2503.20783), which pairs with loss_agg_mode=seq-mean-token-sum-norm.
    Rewards [1, 0, 0, 1] give +-0.866 (would be +-1 with the biased std). returns = advantages.
    """
    mask = as_bool_mask(response_mask)
    scores = _scores(token_level_rewards, mask)
    stats = group_stats(scores, index)
    adv = scores - stats["mean"]
    if norm_adv_by_std_in_grpo:
        adv = adv / (stats["std"] + epsilon)
    adv = torch.where(stats["constant"], torch.zeros_like(adv), adv)
    adv = _per_token(adv, mask)
    return adv, adv


@register_adv_estimator("rloo")
def rloo_advantage(
    token_level_rewards: torch.Tensor,  # [B, T]
    response_mask: torch.Tensor,  # [B, T]
    index: torch.Tensor,  # [B]
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE leave-one-out (Kool et al. 2019; Ahmadian et al. 2024, arXiv:2402.14740).

    A_i = s_i - mean of the other responses' scores = n / (n - 1) * (s_i - mean(group)), on every
    token of response i. returns = advantages.
    """
    mask = as_bool_mask(response_mask)
    scores = _scores(token_level_rewards, mask)
    stats = group_stats(scores, index)
    size = stats["size"]
    adv = (scores - stats["mean"]) * size / (size - 1).clamp(min=1)
    adv = torch.where(stats["constant"], torch.zeros_like(adv), adv)
    adv = _per_token(adv, mask)
    return adv, adv


@register_adv_estimator("reinforce_plus_plus")
def reinforce_plus_plus_advantage(
    token_level_rewards: torch.Tensor,  # [B, T]
    response_mask: torch.Tensor,  # [B, T]
    gamma: float,
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++ (Hu 2025, arXiv:2501.03262): discounted return G_t = r_t + gamma G_{t+1} per
    token, whitened over all valid tokens of the batch (global advantage normalisation).

    returns = the unwhitened G. Like gae, masked positions are skipped (verl resets the running
    return there instead, which cuts a multi-turn response at its first hole).
    """
    mask = as_bool_mask(response_mask)
    rewards = masked_fill_zero(token_level_rewards, mask)
    running = rewards.new_zeros(rewards.shape[0])
    returns = torch.zeros_like(rewards)
    for t in reversed(range(rewards.shape[1])):
        running = torch.where(mask[:, t], rewards[:, t] + gamma * running, running)
        returns[:, t] = running
    returns = masked_fill_zero(returns, mask)
    return masked_whiten(returns, mask), returns


@register_adv_estimator("reinforce_plus_plus_baseline")
def reinforce_plus_plus_baseline_advantage(
    token_level_rewards: torch.Tensor,  # [B, T]
    response_mask: torch.Tensor,  # [B, T]
    index: torch.Tensor,  # [B]
) -> tuple[torch.Tensor, torch.Tensor]:
    """REINFORCE++-baseline (Hu 2025, arXiv:2501.03262, v3+): s_i minus its group's mean, put on
    every token, then whitened over all valid tokens of the batch. returns = advantages.

    Unlike grpo the scale comes from the whole batch, not the group, so a group whose responses
    differ by a hair is not blown up to unit variance.
    """
    mask = as_bool_mask(response_mask)
    scores = _scores(token_level_rewards, mask)
    stats = group_stats(scores, index)
    centred = torch.where(stats["constant"], torch.zeros_like(scores), scores - stats["mean"])
    adv = masked_whiten(_per_token(centred, mask), mask)
    return adv, adv
