"""Splitting a rank's batch into micro-batches: a fixed count, or packed to a token budget.

FSDP2 all-gathers parameters in every forward, so every rank must run the same number of
micro-batches or the collectives deadlock. Fixed sizes guarantee it (ranks hold equal shares);
token-budget packing agrees on the largest count any rank needs, then balances each rank's
rows over that many micro-batches by tokens.
"""

from __future__ import annotations

import math

import torch
from tensordict import TensorDict

from logicrl.workers.fsdp import all_reduce_max


def split_fixed(batch: TensorDict, size: int) -> list[TensorDict]:
    """Consecutive micro-batches of `size` rows; the last may be smaller (forward-only passes)."""
    return list(batch.split(size))


def split_by_tokens(batch: TensorDict, max_tokens: int, device: torch.device, with_index: bool = False):
    """Micro-batches of about `max_tokens` real tokens each, the same count on every rank.

    Rows are dealt longest first to the currently lightest micro-batch (greedy balancing), so
    each holds about the same number of tokens; a row longer than the budget gets its own.
    The budget counts real tokens. With use_remove_padding that is exactly what a micro-batch
    computes (models/packing.py); padded, it computes rows x the batch's full width, which the
    budget does not see (the memory plan assumes full-length rows either way).
    With `with_index`, also returns the batch's row index of every row in the micro-batches'
    concatenation, [N], so per-row outputs can be put back in order (out[argsort(index)]).
    """
    lengths = batch["attention_mask"].sum(-1).tolist()  # [N] real tokens per row
    count = max(1, math.ceil(sum(lengths) / max_tokens), max(1, sum(1 for n in lengths if n > max_tokens)))
    count = min(all_reduce_max(count, device), len(lengths))
    bins: list[list[int]] = [[] for _ in range(count)]
    loads = [0] * count
    for i in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        j = loads.index(min(loads))
        bins[j].append(i)
        loads[j] += lengths[i]
    bins = [sorted(b) for b in bins if b]
    parts = [batch[torch.tensor(b)] for b in bins]
    if with_index:
        return parts, torch.tensor([i for b in bins for i in b], device=batch.device)
    return parts
