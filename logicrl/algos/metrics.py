"""Metric helpers: detached 0-dim tensors under namespaced keys (STYLE.md, 10).

Tensors, not floats, so a worker can compute all of them and move them to the host in one go
instead of a device sync per `.item()`. Each is a statistic of one micro-batch; the worker averages
them over micro-batches as verl does (they are for watching training, not for the gradient).
"""

from __future__ import annotations

import torch

from logicrl.algos.kl import kl_k1, kl_k3
from logicrl.algos.masked import as_bool_mask, masked_fill_zero, masked_mean, masked_var


@torch.no_grad()
def policy_clip_metrics(
    ratio: torch.Tensor,  # [B, T] PolicyLossOutput.ratio
    advantages: torch.Tensor,  # [B, T]
    response_mask: torch.Tensor,  # [B, T]
    clip_ratio_low: float,
    clip_ratio_high: float,
    clip_ratio_c: float | None = None,
) -> dict[str, torch.Tensor]:
    """Fractions of valid tokens whose gradient a clip removed (PPO, arXiv:1707.06347).

    pg_clipfrac_high: A > 0 and r > 1 + clip_ratio_high (DAPO's clip-higher watches this one);
    pg_clipfrac_low:  A < 0 and r < 1 - clip_ratio_low;
    pg_clipfrac:      either, the same number as verl's actor/pg_clipfrac;
    pg_clipfrac_dual: A < 0 and r > clip_ratio_c, the dual clip (verl logs it as pg_clipfrac_lower).
    """
    mask = as_bool_mask(response_mask)
    advantages = masked_fill_zero(advantages, mask)
    high = (advantages > 0) & (ratio > 1 + clip_ratio_high)
    low = (advantages < 0) & (ratio < 1 - clip_ratio_low)
    out = {
        "actor/pg_clipfrac": masked_mean((high | low).float(), mask),
        "actor/pg_clipfrac_high": masked_mean(high.float(), mask),
        "actor/pg_clipfrac_low": masked_mean(low.float(), mask),
    }
    if clip_ratio_c is not None:
        out["actor/pg_clipfrac_dual"] = masked_mean(((advantages < 0) & (ratio > clip_ratio_c)).float(), mask)
    return out


@torch.no_grad()
def approx_kl_metrics(
    log_probs: torch.Tensor,  # [B, T] current policy
    old_log_probs: torch.Tensor,  # [B, T] sampling policy
    response_mask: torch.Tensor,  # [B, T]
) -> dict[str, torch.Tensor]:
    """How far the update has moved the policy: KL(pi_old || pi) over the sampled tokens.

    ppo_kl is k1 (verl's actor/ppo_kl); approx_kl is k3, non-negative and lower-variance (cleanrl's
    losses/approx_kl; Schulman 2020, http://joschu.net/blog/kl-approx.html).
    """
    mask = as_bool_mask(response_mask)
    old, new = masked_fill_zero(old_log_probs, mask), masked_fill_zero(log_probs, mask)
    return {
        "actor/ppo_kl": masked_mean(kl_k1(old, new), mask),
        "actor/approx_kl": masked_mean(kl_k3(old, new), mask),
    }


@torch.no_grad()
def entropy_metrics(entropy: torch.Tensor, response_mask: torch.Tensor) -> dict[str, torch.Tensor]:  # [B, T]
    """Mean per-token entropy of the current policy over valid tokens."""
    return {"actor/entropy": masked_mean(entropy, response_mask)}


@torch.no_grad()
def value_clip_metrics(clipped: torch.Tensor, response_mask: torch.Tensor) -> dict[str, torch.Tensor]:  # [B, T]
    """Fraction of valid tokens where the value clip was active (ValueLossOutput.clipped)."""
    return {"critic/vf_clipfrac": masked_mean(clipped.float(), response_mask)}


@torch.no_grad()
def masked_stats(x: torch.Tensor, response_mask: torch.Tensor, prefix: str) -> dict[str, torch.Tensor]:
    """mean / std / max / min of x over valid tokens (all 0 when there are none)."""
    mask = as_bool_mask(response_mask)
    big = torch.finfo(x.dtype).max
    has_any = mask.any()
    zero = torch.zeros((), dtype=x.dtype, device=x.device)
    return {
        f"{prefix}/mean": masked_mean(x, mask),
        f"{prefix}/std": masked_var(x, mask).sqrt(),
        f"{prefix}/max": torch.where(has_any, torch.where(mask, x, -big).max(), zero),
        f"{prefix}/min": torch.where(has_any, torch.where(mask, x, big).min(), zero),
    }


def advantage_metrics(
    advantages: torch.Tensor,  # [B, T]
    returns: torch.Tensor,  # [B, T]
    response_mask: torch.Tensor,  # [B, T]
) -> dict[str, torch.Tensor]:
    """Advantage and return statistics under verl's keys (critic/advantages/mean, ...)."""
    return {**masked_stats(advantages, response_mask, "critic/advantages"),
            **masked_stats(returns, response_mask, "critic/returns")}
