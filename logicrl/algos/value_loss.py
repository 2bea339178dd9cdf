"""The critic's clipped value loss (GAE runs only)."""

from __future__ import annotations

from typing import NamedTuple

import torch

from logicrl.algos.masked import as_bool_mask, masked_fill_zero


class ValueLossOutput(NamedTuple):
    token_loss: torch.Tensor  # [B, T] loss per token, 0 at masked positions; aggregate with agg_loss
    clipped: torch.Tensor  # [B, T] bool: the clipped branch was the larger (critic/vf_clipfrac)


def value_loss(
    values: torch.Tensor,  # [B, T] current critic, with grad
    old_values: torch.Tensor,  # [B, T] critic at rollout time
    returns: torch.Tensor,  # [B, T] targets from compute_advantage
    response_mask: torch.Tensor,  # [B, T]
    cliprange_value: float,
) -> ValueLossOutput:
    """0.5 * max((V - R)^2, (V_clip - R)^2), V_clip = old + clip(V - old, -c, c), per token.

    The value clipping of OpenAI baselines' PPO2, kept by verl as `critic.cliprange_value`
    (studied in Engstrom et al. 2020, arXiv:2005.12729): the max makes it pessimistic, so the
    critic gets no gradient from a token once its value has moved more than c toward the target.
    """
    if cliprange_value <= 0:
        raise ValueError(f"cliprange_value={cliprange_value} must be > 0")
    mask = as_bool_mask(response_mask)
    values, old_values, returns = (masked_fill_zero(x, mask) for x in (values, old_values, returns))
    clipped_values = old_values + (values - old_values).clamp(-cliprange_value, cliprange_value)
    unclipped_loss = (values - returns) ** 2
    clipped_loss = (clipped_values - returns) ** 2
    loss = 0.5 * torch.maximum(unclipped_loss, clipped_loss)
    return ValueLossOutput(masked_fill_zero(loss, mask), (clipped_loss > unclipped_loss) & mask)
