"""Scoring a step's responses: decode, rule reward per response, token-level scores.

The text runs to the last attended token of each response (attended but untrained tokens are decoded and
scored); the score goes on its last trained token (score_positions: the estimators read rewards through the
loss mask), the last attended one in single-turn responses, where the stop token trains. Each reward
component (format, answer, acc, ...) is averaged into `reward/<name>/mean`. With a learned reward
model the batch holds its scores (`rm_scores` [N], the worker's reward_model phase) and reward.combine
(reward/combine.py) makes each row's sequence reward from it and the rule reward, per data_source;
the rule function is not called where its weight is 0. The learned score's own statistics are
`reward_model/score/{mean,max,min}`, the rule score's (where computed) `reward/rule_score/mean`. The format-error
ratio counts format failures (`format_ok` == 0), not "score == -1" as Logic-RL's did. The rule rewards run
in reward/pool.py's processes, each call bounded by reward.timeout_s; `reward/timeouts` counts the responses
that ran past it (scored reward.timeout_score).
"""

from __future__ import annotations

from collections import defaultdict

import torch
from tensordict import TensorDict

from logicrl.algos import overlong_penalty
from logicrl.algos.masked import response_lengths
from logicrl.reward import REWARD_FNS
from logicrl.reward.combine import CombineRule
from logicrl.reward.pool import InlineScorer

TIMEOUTS = "reward/timeouts"  # a count per step (dynamic sampling's rounds add up, not average)


class RewardManager:
    """`scorer` (reward/pool.py make_scorer) runs the rule rewards; without one, `custom_fn` (or the
    data_source dispatch) runs in this process, unbounded."""

    def __init__(self, tokenizer, custom_fn=None, overlong: dict | None = None, combine: CombineRule | None = None,
                 scorer=None, custom: bool = False):
        self.tokenizer = tokenizer
        self.combine = combine  # with a reward model (reward_model.enable): how its score and the rule's mix
        # A custom reward replaces the data_source dispatch for the whole run.
        self.custom = custom or custom_fn is not None
        self.scorer = scorer if scorer is not None else InlineScorer(custom_fn)
        self.overlong = overlong  # {"len", "penalty_factor"} or None

    def has_rule(self, data_source: str) -> bool:
        # A custom reward takes every data_source (reward.custom replaces the dispatch for the whole run).
        return self.custom or data_source in REWARD_FNS

    def close(self) -> None:
        self.scorer.close()

    def __call__(self, batch: TensorDict) -> tuple[torch.Tensor, dict, list[str], list[dict]]:
        """Score a step's batch: its responses / response_attention_mask [B*n, R] against each row's
        data_source, ground_truth and extra_info.

        Returns token_level_scores [B*n, R], batch metrics, the decoded texts and per-response results.
        """
        responses = batch["responses"]
        lengths = response_lengths(batch["response_attention_mask"])  # [B*n] where each response ends
        texts = [self.tokenizer.decode(r[:n].tolist(), skip_special_tokens=True)
                 for r, n in zip(responses, lengths.tolist())]
        rows = list(zip(batch["data_source"], texts, batch["ground_truth"], batch["extra_info"], strict=True))
        learned = batch.get("rm_scores", None) if self.combine is not None else None
        metrics: dict[str, float] = {}
        if learned is None:  # rules alone (no reward model)
            results, timeouts = self.scorer.score(rows)
        else:
            ruled = [i for i, row in enumerate(rows) if self.has_rule(row[0])]
            rule_results, timeouts = self.scorer.score([rows[i] for i in ruled])
            by_row = dict(zip(ruled, rule_results))
            results = [self.combined(by_row.get(i), float(score), row[0])
                       for i, (row, score) in enumerate(zip(rows, learned.tolist()))]
            learned = learned.float()
            metrics.update({"reward_model/score/mean": float(learned.mean()),
                            "reward_model/score/max": float(learned.max()),
                            "reward_model/score/min": float(learned.min())})
        scores = torch.tensor([r["score"] for r in results], dtype=torch.float32)
        if self.overlong is not None:
            penalty = overlong_penalty(lengths, responses.shape[1], self.overlong["len"],
                                       self.overlong["penalty_factor"])
            scores = scores + penalty
            metrics["reward/overlong_penalty/mean"] = float(penalty.mean())
        token_scores = torch.zeros(responses.shape, dtype=torch.float32)
        last = score_positions(lengths, batch.get("response_mask", None))
        token_scores[torch.arange(len(scores)), last] = scores * (lengths > 0)
        metrics.update(score_metrics(scores, results))
        metrics[TIMEOUTS] = float(timeouts)
        return token_scores, metrics, texts, results

    def combined(self, rule: dict | None, learned: float, source: str) -> dict:
        """One row's result under reward.combine: the rule's components (`rule`, None for a data_source with
        no rule) with `score` the combined reward and `rule_score` the rule's own. The rule is scored wherever
        it exists, weighted 0 or not (for the report: accuracy); only its weight decides whether it
        enters `score`. A source that weighs in a rule it lacks was refused when the rows loaded."""
        rule_score = None if rule is None else float(rule["score"])
        return {**(rule or {}), "rule_score": rule_score, "score": self.combine.combine(learned, rule_score, source)}


def score_positions(lengths: torch.Tensor, trained: torch.Tensor | None) -> torch.Tensor:
    """[B] where each response's score goes: its last trained token (response_mask), else its last attended one
    (`lengths` - 1, response_lengths). Every estimator reads the rewards through the loss mask, so a score on an
    untrained token is dropped: a multi-turn response the budget cut inside a tool turn ends on tool output, and
    its score (a failure, usually) would count as 0. Where the stop token trains (single-turn) the two positions
    are the same."""
    last_attended = lengths - 1
    if trained is None:
        return last_attended.clamp(min=0)
    last_trained = response_lengths(trained) - 1  # the same "last nonzero column", read from the loss mask
    return torch.where(last_trained >= 0, last_trained, last_attended).clamp(min=0)


def accuracy(result: dict) -> float | None:
    """Whether one scored response is right, for the report: the rule's `acc` component, else whether the
    rule's score is positive; None where no rule scored it (a data_source scored by the reward model alone).
    Never the combined score: a reward model's approval is not accuracy."""
    if "acc" in result:
        return float(result["acc"])
    rule = result.get("rule_score", result["score"])  # without a reward model the score is the rule's
    return None if rule is None else float(rule > 0)


def score_metrics(scores: torch.Tensor, results: list[dict]) -> dict[str, float]:
    metrics = {"critic/score/mean": float(scores.mean()), "critic/score/max": float(scores.max()),
               "critic/score/min": float(scores.min())}
    components = defaultdict(list)
    for r in results:
        for key, value in r.items():
            if key != "score" and isinstance(value, (int, float)):
                components[key].append(float(value))
    for key, values in components.items():
        metrics[f"reward/{key}/mean"] = sum(values) / len(values)
    if "format_ok" in components:
        metrics["reward/format_error_ratio"] = 1.0 - metrics["reward/format_ok/mean"]
    return metrics
