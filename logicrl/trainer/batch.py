"""Assembling a step's batch on the controller: prompts + responses -> model inputs, and shards.

Shards are contiguous and equal: rank r owns responses [r*S, (r+1)*S), S = B*n / W, for every
phase after generation. With trainer.balance_batch the rows are first reordered so that every
rank's shard holds about the same number of tokens (`balanced_order`): the ranks wait on each
other at every collective, so the step runs at the pace of the rank with the most tokens.
"""

from __future__ import annotations

import torch
from tensordict import TensorDict


def left_pad(seqs: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(s) for s in seqs)
    ids = torch.full((len(seqs), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(seqs), width), dtype=torch.long)
    for i, s in enumerate(seqs):
        ids[i, width - len(s):] = torch.tensor(s, dtype=torch.long)
        mask[i, width - len(s):] = 1
    return ids, mask


def build_batch(prompt_ids: list[list[int]], responses: torch.Tensor, response_mask: torch.Tensor,
                pad_id: int) -> TensorDict:
    """prompt_ids[i] is response i's prompt; responses/response_mask [N, R]."""
    prompts, prompt_mask = left_pad(prompt_ids, pad_id)  # [N, P]
    attention_mask = torch.cat([prompt_mask, response_mask.long()], dim=1)  # [N, P+R]
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return TensorDict({
        "input_ids": torch.cat([prompts, responses], dim=1),
        "attention_mask": attention_mask,
        "position_ids": position_ids,
        "responses": responses,
        "response_mask": response_mask.long(),
    }, batch_size=[len(prompt_ids)])


def balanced_order(lengths: list[int], parts: int) -> list[int]:
    """A permutation of the rows such that its `parts` equal contiguous shards have near-equal token sums.

    Longest first, each row goes to the lightest shard that still has room (every shard gets
    exactly len/parts rows). Greedy's worst shard exceeds the best by at most one row's length.
    Within a shard the rows keep their original order.
    """
    size = len(lengths) // parts
    assert size * parts == len(lengths), f"{len(lengths)} rows do not split into {parts} equal shards"
    bins: list[list[int]] = [[] for _ in range(parts)]
    loads = [0] * parts
    for i in sorted(range(len(lengths)), key=lambda i: (-lengths[i], i)):
        j = min((j for j in range(parts) if len(bins[j]) < size), key=lambda j: (loads[j], j))
        bins[j].append(i)
        loads[j] += lengths[i]
    return [i for b in bins for i in sorted(b)]


def shards(batch: TensorDict, n_ranks: int) -> list[TensorDict]:
    return list(batch.chunk(n_ranks))


def gather(parts: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat(parts, dim=0)


def merge_rank_metrics(per_rank: list[dict]) -> dict[str, float]:
    """Memory peaks and times take the max over ranks (the rank that would OOM, or that the others
    wait for); everything else the mean. The workers' own phase times go under perf/worker_timing_s/:
    the controller's timing_s/ of the same phase also counts the Ray transfers."""
    keys = {k for m in per_rank for k in m}
    out = {}
    for key in keys:
        values = [m[key] for m in per_rank if key in m]
        name = "perf/worker_" + key if key.startswith("timing_s/") else key
        out[name] = max(values) if key.startswith(("perf/memory/", "timing_s/")) else sum(values) / len(values)
    return out
