"""Assembling a step's batch on the controller: prompts + responses -> model inputs, and shards.

Shards are contiguous and equal: rank r owns responses [r*S, (r+1)*S), S = B*n / W, for every
phase of the step, so each rank trains on what it generated.
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


def shards(batch: TensorDict, n_ranks: int) -> list[TensorDict]:
    return list(batch.chunk(n_ranks))


def gather(parts: list[torch.Tensor]) -> torch.Tensor:
    return torch.cat(parts, dim=0)


def merge_rank_metrics(per_rank: list[dict]) -> dict[str, float]:
    """Memory peaks take the max over ranks (the rank that would OOM); everything else the mean."""
    keys = {k for m in per_rank for k in m}
    out = {}
    for key in keys:
        values = [m[key] for m in per_rank if key in m]
        out[key] = max(values) if key.startswith("perf/memory/") or key.startswith("timing_s/") \
            else sum(values) / len(values)
    return out
