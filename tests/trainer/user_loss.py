"""A policy loss defined outside the package, as a user would (actor_rollout_ref.actor.policy_loss.module).

`offset_pg` is gpg's gradient, -A log pi, with the value `loss_offset` on every token: the gradient is
the same as gpg's, and the run's `actor/pg_loss` (the mean token loss) equals the offset, which shows
the new parameter reached the loss. It declares `rollout_is_weights` and leaves them out, so the
correction's weights do not scale that value.
"""

import torch

from logicrl.algos import PolicyLossOutput, register_policy_loss


@register_policy_loss("offset_pg")
def offset_pg_loss(
    log_probs: torch.Tensor,  # [B, T]
    advantages: torch.Tensor,  # [B, T]
    response_mask: torch.Tensor,  # [B, T]
    loss_offset: float,
    rollout_is_weights: torch.Tensor | None = None,  # [B, T]
) -> PolicyLossOutput:
    mask = response_mask.bool()
    token_loss = -advantages * (log_probs - log_probs.detach()) + loss_offset
    return PolicyLossOutput(torch.where(mask, token_loss, 0.0), torch.ones_like(log_probs))
