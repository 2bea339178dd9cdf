"""Metric helpers: detached 0-dim tensors under namespaced keys (STYLE.md, 10).

Tensors, not floats, so a worker can compute all of them and move them to the host in one go
instead of a device sync per `.item()`. Each is a statistic of one micro-batch; the worker averages
them over micro-batches as verl does (they are for watching training, not for the gradient).
"""

from __future__ import annotations

import torch

from logicrl.algos.kl import kl_k3
from logicrl.algos.masked import as_bool_mask, masked_fill_zero, masked_mean, masked_var


@torch.no_grad()
def policy_clip_metrics(
    ratio: torch.Tensor,  # [B, T] the ratio PPO's clip acted on
    advantages: torch.Tensor,  # [B, T]
    response_mask: torch.Tensor,  # [B, T]
    clip_ratio_low: float,
    clip_ratio_high: float,
    clip_ratio_c: float | None = None,
) -> dict[str, torch.Tensor]:
    """Fractions of valid tokens whose gradient PPO's clip (arXiv:1707.06347) removed, for the losses built on
    its clipped surrogate (vanilla, gspo):

    pg_clipfrac:       A > 0 and r > 1 + clip_ratio_high, or A < 0 and r < 1 - clip_ratio_low (verl's);
    pg_clipfrac_high / _low: each side alone (DAPO's clip-higher watches the first);
    pg_clipfrac_lower: A < 0 and max(-A r, -A clip(r)) > -A clip_ratio_c, the dual clip (verl's name and
                       definition); 0 without a dual clip, as verl reports it for gspo.
    """
    mask = as_bool_mask(response_mask)
    advantages = masked_fill_zero(advantages, mask)
    high = (advantages > 0) & (ratio > 1 + clip_ratio_high)
    low = (advantages < 0) & (ratio < 1 - clip_ratio_low)
    out = {
        "actor/pg_clipfrac": masked_mean((high | low).float(), mask),
        "actor/pg_clipfrac_high": masked_mean(high.float(), mask),
        "actor/pg_clipfrac_low": masked_mean(low.float(), mask),
        "actor/pg_clipfrac_lower": torch.zeros((), device=ratio.device),
    }
    if clip_ratio_c is not None:
        clipped = ratio.clamp(1 - clip_ratio_low, 1 + clip_ratio_high)
        surrogate = torch.maximum(-advantages * ratio, -advantages * clipped)
        dual = (advantages < 0) & (surrogate > -advantages * clip_ratio_c)
        out["actor/pg_clipfrac_lower"] = masked_mean(dual.float(), mask)
    return out


@torch.no_grad()
def ppo_kl(log_ratio: torch.Tensor, response_mask: torch.Tensor) -> dict[str, torch.Tensor]:  # [B, T]
    """verl's actor/ppo_kl: the mean over valid tokens of log pi_old - log pi, the k1 estimate of
    KL(pi_old || pi). `log_ratio` is log pi - log pi_old as the loss used it: clamped where the loss
    clamps it, as verl computes it per loss."""
    return {"actor/ppo_kl": masked_mean(-log_ratio, response_mask)}


@torch.no_grad()
def approx_kl_metrics(
    log_probs: torch.Tensor,  # [B, T] current policy
    old_log_probs: torch.Tensor,  # [B, T]
    response_mask: torch.Tensor,  # [B, T]
) -> dict[str, torch.Tensor]:
    """actor/approx_kl: the mean k3 estimate of KL(pi_old || pi), never negative (cleanrl's
    losses/approx_kl; Schulman 2020, http://joschu.net/blog/kl-approx.html). verl's actor/ppo_kl, the k1
    estimate, comes with each policy loss's output (policy_loss.py): verl defines it per loss."""
    mask = as_bool_mask(response_mask)
    old, new = masked_fill_zero(old_log_probs, mask), masked_fill_zero(log_probs, mask)
    return {"actor/approx_kl": masked_mean(kl_k3(old, new), mask)}


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
