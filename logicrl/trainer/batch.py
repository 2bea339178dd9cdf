"""A step's batch on the controller: one TensorDict from the prompts to the update, and its shards.

    batch = prompt_batch(rows, n, pad_id)    # [B*n]: prompts repeated n times, `uid` = the group

The prompts are left-padded once (data/dataset.collate_prompts), given a group id per prompt and
repeated n times here, the only place the n samples of a prompt are made; generation adds the
responses and masks, balancing permutes the rows, rewards read data_source and ground_truth
from it, and advantages group by its `uid`.

Two masks over the response: `response_attention_mask` [N, R] (what the model sees; the response
part of `attention_mask` [N, P+R]) gives its length, the reward's token and every forward's input;
`response_mask` [N, R] is the loss mask (verl's name and meaning): what trains, read by every
estimator, loss, KL term and loss metric. A single turn has them equal; tool output, attended but
not trained, would be 1 in the first and 0 in the second.

Shards are contiguous and equal (rank r owns rows [r*S, (r+1)*S), S = B*n / W); trainer.balance_batch
first reorders rows so each shard holds about the same tokens (the slowest rank sets the step's pace).
"""

from __future__ import annotations

import torch
from tensordict import TensorDict

from logicrl.algos.masked import response_lengths
from logicrl.data.dataset import NON_TENSOR_FIELDS, collate_prompts
from logicrl.trainer.turns import turn_metrics


def prompt_batch(rows: list, n: int, pad_id: int, first_uid: int = 0) -> TensorDict:
    """[len(rows) * n] rows, prompt-major: rows i*n .. i*n+n-1 are prompt i's group (uid first_uid + i;
    dynamic sampling's later rounds start after the earlier rounds' groups)."""
    batch = collate_prompts(rows, pad_id)
    batch["uid"] = torch.arange(first_uid, first_uid + len(rows))
    return batch.repeat_interleave(n) if n > 1 else batch


# After generation: [N, P+R] tensors (the left-padded prompt, then the right-padded response), and
# [N, R] ones; what cat_rounds pads to a common P and R. Their padding values: 0 but for the ids.
SEQUENCE_FIELDS = ("input_ids", "attention_mask", "position_ids")
RESPONSE_FIELDS = ("responses", "response_attention_mask", "response_mask", "rollout_log_probs",
                   "token_level_scores")


def cat_rounds(parts: list[TensorDict], pad_id: int) -> TensorDict:
    """Generated batches of different widths (each round pads its prompts to its longest and its
    responses to its longest) as one: prompts left-padded and responses right-padded to the widest.
    Padding is masked everywhere (both masks 0, position 0), so no result changes."""
    if len(parts) == 1:
        return parts[0]
    resp = max(p["responses"].shape[1] for p in parts)
    prompt = max(p["input_ids"].shape[1] - p["responses"].shape[1] for p in parts)
    padded = []
    for p in parts:
        r = p["responses"].shape[1]
        left, right = prompt - (p["input_ids"].shape[1] - r), resp - r
        p = p.clone(recurse=False)
        for name in SEQUENCE_FIELDS:
            p[name] = torch.nn.functional.pad(p[name], (left, right), value=pad_id if name == "input_ids" else 0)
        for name in RESPONSE_FIELDS:
            if name in p.keys():
                p[name] = torch.nn.functional.pad(p[name], (0, right), value=pad_id if name == "responses" else 0)
        padded.append(p)
    return torch.cat(padded)


def tensors(batch: TensorDict, keep: tuple[str, ...] = ()) -> TensorDict:
    """What the workers need of a batch: its tensors, without the rows' text fields but those in `keep`
    (the reward model's phase needs the prompts' chats to re-render them)."""
    return batch.exclude(*(name for name in NON_TENSOR_FIELDS if name not in keep))


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


def shards(batch: TensorDict, n_ranks: int, keep: tuple[str, ...] = ()) -> list[TensorDict]:
    """Equal contiguous shards of the batch's tensors, one per rank. A training step's rows always
    split evenly (config/plan.py checks it); validation's need not, so its last shards are padded
    with its first rows, which the caller drops from the gathered result (`[:len(batch)]`)."""
    index = torch.arange(-(-len(batch) // n_ranks) * n_ranks) % len(batch)
    return list(tensors(batch, keep)[index].chunk(n_ranks))


def group_shards(batch: TensorDict, n_ranks: int, group: int, keep: tuple[str, ...] = ()) -> list[TensorDict]:
    """One shard per rank where each `group` consecutive ranks hold the same rows (Ulysses sequence
    parallelism, models/ulysses.py): n_ranks / group shards, each repeated `group` times."""
    return [part for part in shards(batch, n_ranks // group, keep) for _ in range(group)]


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


def length_metrics(response_attention_mask: torch.Tensor, response_mask: torch.Tensor,
                   max_len: int) -> dict[str, float]:
    """response_length/*: the tokens each response sampled (its loss mask), tool output left out (verl counts
    the attention mask; a single turn has the two equal). clip_ratio is the share cut at
    data.max_response_length, the budget the whole trajectory counts in, tool output included."""
    lengths = response_mask.float().sum(-1)  # [N]
    ends = response_lengths(response_attention_mask)  # [N] where each response ends
    return {"response_length/mean": float(lengths.mean()), "response_length/max": float(lengths.max()),
            "response_length/min": float(lengths.min()),
            "response_length/clip_ratio": float((ends >= max_len).float().mean())}


def prompt_length_metrics(batch: TensorDict, max_len: int) -> dict[str, float]:
    """prompt_length/* (verl's names): each row's real prompt tokens, the part of `attention_mask` before the
    response columns; clip_ratio is the share at data.max_prompt_length. The closing memory table plans
    again at the longest (memory/report.py)."""
    columns = batch["input_ids"].shape[1] - batch["responses"].shape[1]
    lengths = batch["attention_mask"][:, :columns].sum(-1).float()  # [N]
    return {"prompt_length/mean": float(lengths.mean()), "prompt_length/max": float(lengths.max()),
            "prompt_length/min": float(lengths.min()),
            "prompt_length/clip_ratio": float((lengths >= max_len).float().mean())}


def shape_metrics(batch: TensorDict, max_prompt: int, max_response: int) -> dict[str, float]:
    """What a trained batch looked like: response and prompt lengths (verl's names) and, for multi-turn runs,
    its turns and tool calls."""
    return (length_metrics(batch["response_attention_mask"], batch["response_mask"], max_response)
            | prompt_length_metrics(batch, max_prompt) | turn_metrics(batch))
