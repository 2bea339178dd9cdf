"""Validation's report: accuracy overall, per data_source and per number of K&K people, and samples.

The trainer generates for every validation prompt (rollout.val_kwargs.n each) on the same path
as a training step (trainer/ppo.py `validate`) and scores the batch; this module turns the
scored batch into metrics: `val/acc`, `val/<source>/acc` and, for K&K, `val/kk_logic/<k>ppl/acc`, over
the rows a rule scored (trainer/rewards.py `accuracy`), and `val/score` over all.
A sample of generations goes to the run directory as val_generations/step_<N>.jsonl, to read
what the model actually wrote.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

from tensordict import TensorDict

from logicrl.trainer.rewards import accuracy

SAMPLES_WRITTEN = 20


def validation_metrics(batch: TensorDict, results: list[dict]) -> dict[str, float]:
    groups: dict[str, list[float]] = defaultdict(list)
    for source, extra, result in zip(batch["data_source"], batch["extra_info"], results, strict=True):
        groups["val/score"].append(result["score"])
        acc = accuracy(result)
        if acc is None:  # a data_source scored by the reward model alone: no accuracy to report
            continue
        groups["val/acc"].append(acc)
        groups[f"val/{source}/acc"].append(acc)
        people = (extra or {}).get("n_people")
        if source == "kk_logic" and people is not None:
            groups[f"val/kk_logic/{people}ppl/acc"].append(acc)
    return {k: sum(v) / len(v) for k, v in groups.items()}


def write_samples(run_dir: Path, step: int, batch: TensorDict, texts: list[str], results: list[dict],
                  conversations: list[str] | None = None) -> None:
    """The first SAMPLES_WRITTEN rows; with tools, each also as its whole conversation (`conversation`:
    the response with its turn markers and tool answers, as the model read it)."""
    out_dir = run_dir / "val_generations"
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = zip(batch["prompt_text"], texts, batch["ground_truth"], results, conversations or [None] * len(texts))
    with (out_dir / f"step_{step}.jsonl").open("w") as f:
        for prompt, text, truth, result, conversation in list(rows)[:SAMPLES_WRITTEN]:
            sample = {"prompt": prompt, "response": text, "ground_truth": truth, "result": result}
            if conversation is not None:
                sample["conversation"] = conversation
            f.write(json.dumps(sample, default=str) + "\n")
