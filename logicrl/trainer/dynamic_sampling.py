"""DAPO's dynamic sampling on the controller: generate rounds of prompts until the step's batch is full.

    filled = fill(next_round, target=plan.prompts, n=plan.n, max_rounds=plan.max_gen_rounds, max_empty=10)

`next_round(i)` draws the next data.gen_batch_size prompts, generates and scores them (the trainer's
generate, reward_model and reward phases) and returns them with the filter's metric per response.
Groups whose metric does not vary are dropped (algos/group_filter.py); kept groups accumulate until
`target` are kept, and any beyond it are dropped as verl does (the first ones kept are trained). At
`max_rounds` short of the target, or after `max_empty` rounds in a row that kept nothing (whatever
`max_rounds` is, None included: a constant reward would otherwise generate forever), `Filled.short` says
so and the trainer trains on what it has (or ends the run: algorithm.filter_groups.on_limit). The
prompts a step consumes vary, so the trainer checkpoints its round count, not its step, as the sampler's position.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from tensordict import TensorDict

from logicrl.algos.group_filter import groups_with_spread
from logicrl.trainer.rewards import TIMEOUTS, accuracy

# Metrics computed from the token-level scores; any other name is read from each response's result.
FROM_SCORES = ("seq_reward", "seq_final_reward")


class FilterMetricError(ValueError):
    pass


def metric_values(name: str, token_scores: torch.Tensor, results: list[dict]) -> torch.Tensor:
    """[B] the filter's metric per response: `seq_reward` / `seq_final_reward` the sequence's reward
    (token_scores [B, R] summed: the rule score plus any overlong penalty; validate.py refuses
    seq_final_reward with a KL-in-reward penalty), `acc` the rule's accuracy (trainer/rewards.py
    accuracy), any other name that numeric field of the reward function's result (`score`, ...)."""
    if name in FROM_SCORES:
        return token_scores.sum(-1)
    values = [accuracy(r) if name == "acc" else r.get(name) for r in results]
    if not all(isinstance(v, (int, float)) for v in values):
        found = sorted(k for k, v in results[0].items() if isinstance(v, (int, float))) if results else []
        raise FilterMetricError(f"algorithm.filter_groups.metric={name}: the reward gives no number of that name "
                                f"(its numeric fields: {', '.join(found) or 'none'}); use acc, score, seq_reward, "
                                "seq_final_reward or one of those")
    return torch.tensor([float(v) for v in values], dtype=torch.float64)


@dataclass
class Round:
    batch: TensorDict  # [G*n] generated and scored rows (token_level_scores among them), uid per group
    values: torch.Tensor  # [G*n] the filter's metric
    metrics: dict  # the round's reward metrics


@dataclass
class Filled:
    batch: TensorDict | None  # the kept groups' rows, at most target * n; None when none was kept
    rounds: int
    prompts: int  # prompts generated for (consumed from the data), kept or not
    kept: int  # groups that passed the filter (before the batch was cut at target)
    dropped: int
    short: bool  # the round limit stopped it before `target` groups were kept
    reward_metrics: dict = field(default_factory=dict)  # over every generated response of the step
    empty: int = 0  # the rounds in a row, at the end, that kept no group

    def step_metrics(self) -> dict[str, float]:
        return {"filter/groups_kept": float(self.kept), "filter/groups_dropped": float(self.dropped),
                "filter/kept_ratio": self.kept / max(self.kept + self.dropped, 1),
                "filter/gen_rounds": float(self.rounds), "filter/prompts_consumed": float(self.prompts),
                "filter/short": float(self.short)}


def fill(next_round: Callable[[int], Round], target: int, n: int, max_rounds: int | None, max_empty: int,
         cat: Callable[[list[TensorDict]], TensorDict] = torch.cat) -> Filled:
    """Rounds from `next_round(0)`, `next_round(1)`, ... until `target` groups with a spread are kept,
    `max_rounds` rounds ran (None: no limit) or `max_empty` rounds in a row kept none. `cat` joins the
    rounds' batches (trainer/batch.py cat_rounds pads their widths)."""
    kept_parts, per_round, kept, dropped, prompts, empty = [], [], 0, 0, 0, 0
    for i in itertools.count():
        rnd = next_round(i)
        keep = groups_with_spread(rnd.batch["uid"], rnd.values)
        groups, kept_here = len(rnd.batch) // n, int(keep.sum()) // n
        prompts, kept, dropped = prompts + groups, kept + kept_here, dropped + groups - kept_here
        empty = 0 if kept_here else empty + 1
        per_round.append((len(rnd.batch), rnd.metrics))
        if kept_here:
            kept_parts.append(rnd.batch[keep])
        if kept >= target or (max_rounds is not None and i + 1 >= max_rounds) or empty >= max_empty:
            break
    batch = cat(kept_parts)[:target * n] if kept_parts else None
    return Filled(batch, i + 1, prompts, kept, dropped, kept < target, merge_round_metrics(per_round), empty=empty)


def merge_round_metrics(rounds: list[tuple[int, dict]]) -> dict[str, float]:
    """One step's reward metrics from its rounds' (rows, metrics): `.../max` the max, `.../min` the min,
    every other value (a mean or a ratio over responses) the mean weighted by the round's rows."""
    keys = {k for _, m in rounds for k in m}
    out = {}
    for key in keys:
        have = [(rows, m[key]) for rows, m in rounds if key in m]
        if key == TIMEOUTS:  # a count: the step's is the rounds' sum
            out[key] = sum(v for _, v in have)
        elif key.endswith("/max"):
            out[key] = max(v for _, v in have)
        elif key.endswith("/min"):
            out[key] = min(v for _, v in have)
        else:
            out[key] = sum(rows * v for rows, v in have) / sum(rows for rows, _ in have)
    return out


def trainable_prompts(kept: int, minis: list[int]) -> int:
    """Of `kept` prompts, how many a short batch trains: whole mini-batches of every trained role
    (each role's ppo_mini_batch_size must divide the batch, as config/plan.py checks for a full one)."""
    step = math.lcm(*minis)
    return kept // step * step
