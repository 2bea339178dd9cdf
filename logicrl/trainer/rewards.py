"""Scoring a step's responses: decode, rule reward per response, token-level scores.

The score goes on the last valid token of each response (verl's convention), and each reward
component (format, answer, acc, ...) is averaged into `reward/<name>/mean`. The format-error
ratio counts format failures (`format_ok` == 0), not "score == -1" as Logic-RL's did.
"""

from __future__ import annotations

from collections import defaultdict

import torch
from tensordict import TensorDict

from logicrl.algos import overlong_penalty
from logicrl.reward import compute_score


class RewardManager:
    def __init__(self, tokenizer, custom_fn=None, overlong: dict | None = None):
        self.tokenizer = tokenizer
        self.custom_fn = custom_fn  # replaces the data_source dispatch for the whole run
        self.overlong = overlong  # {"len", "penalty_factor"} or None

    def score_one(self, data_source: str, text: str, ground_truth, extra_info) -> dict:
        if self.custom_fn is not None:
            return self.custom_fn(data_source=data_source, solution_str=text, ground_truth=ground_truth,
                                  extra_info=extra_info)
        return compute_score(data_source, text, ground_truth, extra_info)

    def __call__(self, batch: TensorDict) -> tuple[torch.Tensor, dict, list[str], list[dict]]:
        """Score a step's batch: its responses / response_mask [B*n, R] against each row's
        data_source, ground_truth and extra_info.

        Returns token_level_scores [B*n, R], batch metrics, the decoded texts and per-response results.
        """
        responses, response_mask = batch["responses"], batch["response_mask"]
        lengths = response_mask.sum(-1)  # [B*n]
        texts = [self.tokenizer.decode(r[:n].tolist(), skip_special_tokens=True)
                 for r, n in zip(responses, lengths.tolist())]
        results = [self.score_one(source, text, truth, extra) for source, text, truth, extra
                   in zip(batch["data_source"], texts, batch["ground_truth"], batch["extra_info"], strict=True)]
        scores = torch.tensor([r["score"] for r in results], dtype=torch.float32)
        metrics: dict[str, float] = {}
        if self.overlong is not None:
            penalty = overlong_penalty(lengths, response_mask.shape[1], self.overlong["len"],
                                       self.overlong["penalty_factor"])
            scores = scores + penalty
            metrics["reward/overlong_penalty/mean"] = float(penalty.mean())
        token_scores = torch.zeros(response_mask.shape, dtype=torch.float32)
        last = (lengths - 1).clamp(min=0)
        token_scores[torch.arange(len(scores)), last] = scores * (lengths > 0)
        metrics.update(score_metrics(scores, results))
        return token_scores, metrics, texts, results


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
