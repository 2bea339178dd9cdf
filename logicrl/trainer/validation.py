"""Validation: generate for every validation prompt with rollout.val_kwargs, score, report.

Accuracy is reported overall (`val/acc`), per data_source (`val/<source>/acc`) and, for K&K,
per number of people (`val/kk_logic/<k>ppl/acc`). A sample of generations goes to the run
directory as val_generations/step_<N>.jsonl, to read what the model actually wrote.
"""

from __future__ import annotations

import json
from collections import defaultdict
from pathlib import Path

import torch

SAMPLES_WRITTEN = 20


def validate_generations(workers, val_set, rewards, params: dict, run_dir: Path, step: int) -> dict:
    rows = [val_set[i] for i in range(len(val_set))]
    n = params["n"]
    # Ranks get near-equal slices; generation is independent per rank, so sizes may differ.
    ranks = len(workers)
    bounds = [round(r * len(rows) / ranks) for r in range(ranks + 1)]
    parts = [rows[bounds[r]:bounds[r + 1]] for r in range(ranks)]
    outs = workers.dispatch("generate", [[row.input_ids for row in part] or [rows[0].input_ids] for part in parts],
                            params=params)
    responses, masks, pairs = [], [], []
    for part, (out, _) in zip(parts, outs):
        if part:  # an empty slice generated one throwaway prompt to keep the call uniform
            responses.append(out["responses"])
            masks.append(out["response_mask"])
            pairs += [row for row in part for _ in range(n)]
    responses, masks = torch.cat(responses), torch.cat(masks)
    _, _, texts, results = rewards(responses, masks, pairs)

    groups: dict[str, list[float]] = defaultdict(list)
    for row, result in zip(pairs, results):
        acc = float(result.get("acc", result["score"] > 0))
        groups["val/acc"].append(acc)
        groups[f"val/{row.data_source}/acc"].append(acc)
        people = (row.extra_info or {}).get("n_people")
        if row.data_source == "kk_logic" and people is not None:
            groups[f"val/kk_logic/{people}ppl/acc"].append(acc)
        groups["val/score"].append(result["score"])
    metrics = {k: sum(v) / len(v) for k, v in groups.items()}

    out_dir = run_dir / "val_generations"
    out_dir.mkdir(parents=True, exist_ok=True)
    with (out_dir / f"step_{step}.jsonl").open("w") as f:
        for row, text, result in list(zip(pairs, texts, results))[:SAMPLES_WRITTEN]:
            f.write(json.dumps({"prompt": row.prompt_text, "response": text, "ground_truth": row.ground_truth,
                                "result": result}, default=str) + "\n")
    return metrics
