"""Clip-Cov and KL-Cov (Cui et al. 2025, "The Entropy Mechanism of RL for Reasoning LMs", arXiv:2505.22617).

Both are PPO's clipped loss with a handful of tokens treated apart: those whose centred covariance
cov_t = (A_t - mean A) * (log pi_t - mean log pi) is largest, the tokens that drive entropy collapse.
Clip-Cov drops the gradient of a random clip_cov_ratio share of the tokens with cov in (clip_cov_lb,
clip_cov_ub); KL-Cov adds ppo_kl_coef * |log r| to the top kl_cov_ratio share by cov. The means and
the share are taken over the tokens the loss sees, a micro-batch, as in verl: the selection depends
on how a mini-batch is split (the paper's batch is verl's micro-batch too). Neither has a dual clip.
Their log-ratios are clamped at +-20 before exp; verl's are not (policy_loss.py, MAX_LOG_RATIO).
"""

from __future__ import annotations

import torch

from logicrl.algos.masked import as_bool_mask, masked_count, masked_fill_zero, masked_mean
from logicrl.algos.metrics import ppo_kl
from logicrl.algos.policy_loss import PolicyLossOutput, _clipped_surrogate, clamped_log_ratio, register_policy_loss


def _covariance(log_probs: torch.Tensor, advantages: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """[B, T] (A - mean A)(log pi - mean log pi) over the masked tokens, detached; -inf where masked."""
    lp = log_probs.detach()
    cov = (advantages - masked_mean(advantages, mask)) * (lp - masked_mean(lp, mask))
    return cov.masked_fill(~mask, -torch.inf)


def _share(ratio: float, mask: torch.Tensor) -> int:
    """How many tokens a ratio selects: at least one, as verl (int(ratio * tokens), floored at 1)."""
    return max(int(ratio * int(mask.sum())), 1)


@register_policy_loss("clip_cov")
def clip_cov_policy_loss(
    log_probs: torch.Tensor,  # [B, T]
    old_log_probs: torch.Tensor,  # [B, T]
    advantages: torch.Tensor,  # [B, T]
    response_mask: torch.Tensor,  # [B, T]
    clip_ratio_low: float,
    clip_ratio_high: float,
    clip_cov_ratio: float = 0.0002,
    clip_cov_lb: float = 1.0,
    clip_cov_ub: float = 5.0,
) -> PolicyLossOutput:
    """PPO's clipped loss, with the gradient of up to clip_cov_ratio x tokens set to 0: picked at random
    (torch's global generator, seeded by the run) among the tokens PPO did not clip whose covariance
    lies strictly between clip_cov_lb and clip_cov_ub. pg_clipfrac is verl's: the share of tokens so
    detached (PPO's own clip shows in pg_clipfrac_high / _low)."""
    if clip_cov_ratio <= 0:
        raise ValueError(f"clip_cov_ratio={clip_cov_ratio} must be > 0")
    mask = as_bool_mask(response_mask)
    log_ratio = clamped_log_ratio(log_probs, old_log_probs, mask)
    ratio = torch.exp(log_ratio)
    advantages = masked_fill_zero(advantages, mask)
    loss = _clipped_surrogate(ratio, advantages, clip_ratio_low, clip_ratio_high)
    clipped_by_ppo = (-advantages * ratio.clamp(1 - clip_ratio_low, 1 + clip_ratio_high) > -advantages * ratio)
    cov = _covariance(log_probs, advantages, mask).masked_fill(clipped_by_ppo, -torch.inf)
    candidates = torch.nonzero(mask & (cov > clip_cov_lb) & (cov < clip_cov_ub))  # [K, 2]
    chosen = candidates[torch.randperm(len(candidates))[:_share(clip_cov_ratio, mask)].to(candidates.device)]
    live = torch.ones_like(mask)  # tokens that keep their gradient
    live[chosen[:, 0], chosen[:, 1]] = False
    high = (advantages > 0) & (ratio > 1 + clip_ratio_high)
    low = (advantages < 0) & (ratio < 1 - clip_ratio_low)
    metrics = {"actor/pg_clipfrac": len(chosen) / masked_count(mask).clamp(min=1),
               "actor/pg_clipfrac_high": masked_mean(high.float(), mask).detach(),
               "actor/pg_clipfrac_low": masked_mean(low.float(), mask).detach(),
               **ppo_kl(masked_fill_zero(log_probs - old_log_probs, mask), mask)}
    return PolicyLossOutput(masked_fill_zero(loss, mask & live), ratio, metrics)


@register_policy_loss("kl_cov")
def kl_cov_policy_loss(
    log_probs: torch.Tensor,  # [B, T]
    old_log_probs: torch.Tensor,  # [B, T]
    advantages: torch.Tensor,  # [B, T]
    response_mask: torch.Tensor,  # [B, T]
    kl_cov_ratio: float = 0.0002,
    ppo_kl_coef: float = 0.1,
) -> PolicyLossOutput:
    """-A * r per token (no clip), plus ppo_kl_coef * |log r| on the kl_cov_ratio x tokens with the largest
    covariance (ties broken by position, deterministically). ppo_kl is verl's for this loss: the mean
    |log r|."""
    if kl_cov_ratio <= 0:
        raise ValueError(f"kl_cov_ratio={kl_cov_ratio} must be > 0")
    mask = as_bool_mask(response_mask)
    log_ratio = clamped_log_ratio(log_probs, old_log_probs, mask)
    ratio = torch.exp(log_ratio)
    advantages = masked_fill_zero(advantages, mask)
    loss = -advantages * ratio
    flat = _covariance(log_probs, advantages, mask).flatten()
    top = torch.topk(flat, min(_share(kl_cov_ratio, mask), int(mask.sum())), largest=True).indices
    penalised = torch.zeros_like(flat, dtype=torch.bool)
    penalised[top] = True
    loss = torch.where(penalised.view_as(mask), loss + ppo_kl_coef * log_ratio.abs(), loss)
    metrics = ppo_kl(-masked_fill_zero(log_probs - old_log_probs, mask).abs(), mask)
    return PolicyLossOutput(masked_fill_zero(loss, mask), ratio, metrics)
