"""Loss aggregation, chosen by `actor_rollout_ref.actor.loss_agg_mode` from AGG_MODES.

Every mode is a weighted sum of token losses over a normaliser N, loss = sum_i w_i sum_t m_it L_it / N:
token-mean (w 1, N valid tokens), seq-mean-token-sum (1, sequences), seq-mean-token-mean (1/|y_i|,
sequences), seq-mean-token-sum-norm (1/max_response_length, sequences); docs/configuration.md.

N belongs to the whole mini-batch: `loss_normalizer` computes it once, before splitting (summed over
ranks), and every micro-batch divides by it, times dp_size to undo FSDP's gradient averaging. The
micro-batch losses then sum to the mini-batch loss exactly, so the accumulated gradient is the
full-batch gradient however unequal the micro-batches; dividing by each micro-batch's own count, as
older verl does, weights small micro-batches' tokens more. Rows with no valid token count for nothing.

seq-mean-token-sum-norm is Dr. GRPO's (Liu et al. 2025, arXiv:2503.20783): the sequence mean of token sums
over a constant, as verl computes it since its PR 5417 (the same numbers); the constant is passed in.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from logicrl import algo_names
from logicrl.algos.masked import as_bool_mask, masked_count, masked_sum
from logicrl.algos.registry import Registry


class AggMode(NamedTuple):
    # (token_loss [B, T], mask [B, T] bool, max_response_length) -> weighted sum per sequence [B]
    seq_numerator: Callable[[torch.Tensor, torch.Tensor, int | None], torch.Tensor]
    counts: str  # what the normaliser counts: "tokens" or "sequences"


AGG_MODES = Registry("actor_rollout_ref.actor.loss_agg_mode", names=algo_names.LOSS_AGG_MODES)


def register_agg_mode(name: str, *, counts: str):
    if counts not in ("tokens", "sequences"):
        raise ValueError(f"counts={counts!r}; the normaliser counts 'tokens' or 'sequences'")

    def decorator(seq_numerator):
        AGG_MODES.register(name)(AggMode(seq_numerator, counts))
        return seq_numerator

    return decorator


def _token_sum(token_loss, mask, max_response_length):
    return masked_sum(token_loss, mask, dim=-1)


register_agg_mode("token-mean", counts="tokens")(_token_sum)
register_agg_mode("seq-mean-token-sum", counts="sequences")(_token_sum)


@register_agg_mode("seq-mean-token-mean", counts="sequences")
def _token_mean(token_loss, mask, max_response_length):
    return masked_sum(token_loss, mask, dim=-1) / masked_count(mask, -1, token_loss.dtype).clamp(min=1)


@register_agg_mode("seq-mean-token-sum-norm", counts="sequences")
def _token_sum_norm(token_loss, mask, max_response_length):
    if max_response_length is None or max_response_length < 1:
        raise ValueError(
            "loss_agg_mode=seq-mean-token-sum-norm divides by a constant; pass "
            f"max_response_length=data.max_response_length (got {max_response_length})"
        )
    return masked_sum(token_loss, mask, dim=-1) / max_response_length


def loss_normalizer(
    response_mask: torch.Tensor,  # [B, T] of the WHOLE mini-batch
    loss_agg_mode: str,
) -> torch.Tensor:  # 0-dim float
    """N for `loss_agg_mode`: valid tokens (token-mean) or sequences with a valid token (others)."""
    mask = as_bool_mask(response_mask)
    if AGG_MODES[loss_agg_mode].counts == "tokens":
        return masked_count(mask)
    return mask.any(dim=-1).float().sum()


def agg_loss(
    token_loss: torch.Tensor,  # [B, T] of one micro-batch (or the whole mini-batch)
    response_mask: torch.Tensor,  # [B, T]
    loss_agg_mode: str,
    *,
    normalizer: torch.Tensor | float | None = None,
    max_response_length: int | None = None,
) -> torch.Tensor:  # 0-dim
    """This micro-batch's share of the mini-batch loss: sum_i w_i sum_t m_it L_it / normalizer.

    normalizer=None uses this batch's own count, right only when the batch is the whole mini-batch.
    A zero normaliser (nothing valid anywhere) gives a loss of 0 with zero gradient, not nan.
    """
    mode = AGG_MODES[loss_agg_mode]
    mask = as_bool_mask(response_mask)
    total = mode.seq_numerator(token_loss, mask, max_response_length).sum()
    if normalizer is None:
        normalizer = loss_normalizer(mask, loss_agg_mode)
    normalizer = torch.as_tensor(normalizer, dtype=total.dtype, device=total.device)
    # When N is 0 the numerator is 0 too (no valid token); dividing by 1 keeps it 0 and finite.
    return total / torch.where(normalizer > 0, normalizer, torch.ones_like(normalizer))
