"""Validation's report: accuracy overall, per data_source and per number of K&K people, and samples.

The trainer generates for every validation prompt (rollout.val_kwargs.n each) on the same path
as a training step (trainer/ppo.py `validate`) and scores the batch; this module turns the
scored batch into metrics: `val/acc`, `val/<source>/acc` and, for rows with extra_info.n_people (K&K, the
recall task), `val/<source>/<k>ppl/acc`, over
the rows a rule scored (trainer/rewards.py `accuracy`), and `val/score` over all.
A sample of generations goes to the run directory as val_generations/step_<N>.jsonl, to read
what the model actually wrote. Every response also becomes a scored sample (`scored_samples`: its
extracted answer, correctness and whether it ended) for eval/report.py's pass@k, maj@k and intervals,
logged as `val/<source>/pass@k` etc. beside the accuracies.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import torch
from tensordict import TensorDict

from logicrl.algos.masked import response_lengths
from logicrl.eval.answers import extract
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
        if people is not None:  # K&K and the recall task: a curriculum's stages differ by people
            groups[f"val/{source}/{people}ppl/acc"].append(acc)
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


def scored_samples(batch: TensorDict, texts: list[str], results: list[dict], n: int, max_len: int,
                   stop_ids: list[int]) -> list[dict]:
    """One row per response of a prompt-major batch (prompt i's n responses are rows i*n .. i*n+n-1): its
    problem and sample index, text, extracted answer, score, correctness and whether it completed, i.e.
    ended on a stop token or before data.max_response_length (a response cut by the limit did not)."""
    lengths = response_lengths(batch["response_attention_mask"])  # [B*n]
    last = batch["responses"].gather(1, (lengths - 1).clamp(min=0).unsqueeze(1)).squeeze(1)  # [B*n]
    stopped = torch.isin(last, torch.tensor(stop_ids, dtype=last.dtype)) & (lengths > 0)
    completed = ((lengths < max_len) | stopped).tolist()
    rows = zip(batch["data_source"], batch["ground_truth"], batch["extra_info"], texts, results, completed, strict=True)
    samples = []
    for i, (source, truth, extra, text, result, done) in enumerate(rows):
        sample = {"data_source": source, "problem": i // n, "sample": i % n, "response": text,
                  "answer": extract(source, text, truth), "score": float(result["score"]),
                  "correct": accuracy(result), "completed": bool(done)}
        if (people := (extra or {}).get("n_people")) is not None:
            sample["people"] = int(people)
        samples.append(sample)
    return samples


def val_only_line(val: dict) -> str:
    """trainer.val_only's result: the accuracy of each data_source (val/<source>/acc), then over all."""
    # Sources may hold slashes (lighteval/MATH); kk_logic's per-size keys come along, as sources of their own.
    sources = sorted(k[len("val/"):-len("/acc")] for k in val if k.startswith("val/") and k.endswith("/acc")
                     and k != "val/acc")
    parts = [f"{source} {val[f'val/{source}/acc']:.3f}" for source in sources]
    return "logicrl: validation accuracy per data_source: " + ", ".join(parts) + \
        (f"; all {val['val/acc']:.3f}" if "val/acc" in val else "")
