"""Loss aggregation, chosen by `actor_rollout_ref.actor.loss_agg_mode` from AGG_MODES.

Every mode is a weighted sum of token losses over a normaliser N:

    loss = sum_i w_i * sum_t m_it * L_it / N

    mode                      w_i                       N counts
    token-mean                1                         valid tokens         (DAPO's token-level loss)
    seq-mean-token-sum        1                         sequences
    seq-mean-token-mean       1 / |y_i|                 sequences            (the GRPO paper's form)
    seq-mean-token-sum-norm   1 / max_response_length   sequences            (Dr. GRPO's constant)

w_i depends only on sequence i, and a micro-batch never splits a sequence, so each micro-batch can
compute its own numerator. N is a property of the whole mini-batch (one optimizer step).

Carrying the normaliser (the contract with the actor/critic workers):

    N = loss_normalizer(mini_batch_mask, mode)            # once per mini-batch, before splitting;
                                                          # with data parallel, all-reduce-summed
    for micro in micro_batches:                           # any sizes, any padding lengths
        loss = agg_loss(micro.token_loss, micro.mask, mode, normalizer=N,
                        max_response_length=data.max_response_length) * dp_size
        loss.backward()                                   # no division by the number of micro-batches
    optimizer.step()

The micro-batch losses then sum to the mini-batch loss exactly, so the accumulated gradient is the
full-batch gradient for every mode, however unequal the micro-batches (dynamic batch size, padding
removal). Dividing each micro-batch by its own count and then by the number of micro-batches, as
verl used to, weights the tokens of small micro-batches more. `* dp_size` undoes FSDP/DDP's
gradient averaging across ranks, which would otherwise divide the global sum a second time.
Each mini-batch (and each ppo epoch over it) is its own optimizer step, so N is recomputed per
mini-batch; nothing carries over between mini-batches.

Sequences are counted only if they have a valid token, so all-padding rows (added to even out
shapes) change nothing.

seq-mean-token-sum-norm departs from verl, which divides sum_i sum_t by max_response_length alone
(no 1/#sequences, so its scale grows with the batch). We follow Dr. GRPO (Liu et al. 2025,
arXiv:2503.20783; their code takes the sequence mean), and the constant must be passed in: a
micro-batch's padded width is not a constant once padding is trimmed per micro-batch.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import NamedTuple

import torch

from logicrl.algos.masked import as_bool_mask, masked_count, masked_sum
from logicrl.algos.registry import Registry


class AggMode(NamedTuple):
    # (token_loss [B, T], mask [B, T] bool, max_response_length) -> weighted sum per sequence [B]
    seq_numerator: Callable[[torch.Tensor, torch.Tensor, int | None], torch.Tensor]
    counts: str  # what the normaliser counts: "tokens" or "sequences"


AGG_MODES = Registry("actor_rollout_ref.actor.loss_agg_mode")


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
