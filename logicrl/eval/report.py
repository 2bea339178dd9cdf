"""Scored samples -> metrics per data_source with intervals, and what a researcher reads of them.

    metrics = group_metrics(samples, ks)   # {group: {"mean@4": {"value", "low", "high"}, "pass@2": ...}}
    flat_metrics(metrics)                  # {"val/<group>/pass@2": v, "val/<group>/pass@2/low": ...}

A sample is one response: data_source, problem (its row in the evaluation set), sample (0..n-1),
response, answer (eval/answers.py), score (the reward), correct (the rule's accuracy: trainer/rewards.py
`accuracy`; None where only a reward model scored), completed (ended by an end-of-sequence token, not by
the length limit), and `people` where the row's extra_info has n_people (K&K, the recall task). Groups are
the data_sources, and <source>/<p>ppl per people count.
Every metric is a mean over problems: mean@n (each problem's share right), pass@k, maj@k, completed (share
of responses that ended) and completed_correct (ended and right); intervals as in eval/estimators.py.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

from logicrl.eval.estimators import bootstrap, maj_at_k, pass_at_k, wilson

SAMPLES_FILE, EVAL_JSON, EVAL_MD, PASS_AT_K_PNG = "samples.jsonl", "eval.json", "eval.md", "pass_at_k.png"
SAMPLE_KEYS = ("data_source", "problem", "sample", "response", "answer", "score", "correct", "completed")


def groups_of(sample: dict) -> list[str]:
    source = sample["data_source"]
    people = sample.get("people")
    return [source] + ([f"{source}/{people}ppl"] if people is not None else [])


def _interval(value: float, low: float, high: float) -> dict[str, float]:
    # A bootstrap mean of equal values, or Wilson's bound at a share of 1, can miss the value by a rounding.
    return {"value": value, "low": min(low, value), "high": max(high, value)}


def _share(values: list[float], problems: int) -> dict[str, float]:
    value = sum(values) / len(values)
    return _interval(value, *wilson(value, problems))


def problem_metrics(by_problem: list[list[dict]], ks: Iterable[int]) -> dict[str, dict[str, float]]:
    """One group's metrics from its problems' samples (each problem's list in sample order)."""
    n = min(len(samples) for samples in by_problem)
    problems = len(by_problem)
    out: dict[str, dict[str, float]] = {}
    if all(s["correct"] is not None for samples in by_problem for s in samples):
        right = [[bool(s["correct"]) for s in samples[:n]] for samples in by_problem]
        out[f"mean@{n}"] = _share([sum(r) / n for r in right], problems)
        for k in (k for k in ks if k <= n):
            per = [pass_at_k(n, sum(r), k) for r in right]
            out[f"pass@{k}"] = _interval(sum(per) / problems, *bootstrap(per))
        for k in (k for k in ks if k <= n):
            per = [maj_at_k([s["answer"] for s in samples[:n]], r, k) for samples, r in zip(by_problem, right)]
            out[f"maj@{k}"] = _interval(sum(per) / problems, *bootstrap(per))
    done = [[bool(s["completed"]) for s in samples[:n]] for samples in by_problem]
    out["completed"] = _share([sum(d) / n for d in done], problems)
    if "mean@" + str(n) in out:
        both = [sum(d and r for d, r in zip(ds, rs)) / n for ds, rs in zip(done, right)]
        out["completed_correct"] = _share(both, problems)
    return out


def group_metrics(samples: Iterable[dict], ks: Iterable[int]) -> dict[str, dict[str, dict[str, float]]]:
    """{group: {metric: {value, low, high}}} over `samples` (module docstring), groups sorted."""
    grouped: dict[str, dict[int, list[dict]]] = defaultdict(lambda: defaultdict(list))
    for s in samples:
        for group in groups_of(s):
            grouped[group][s["problem"]].append(s)
    ks = sorted(set(ks))
    return {group: problem_metrics([sorted(p, key=lambda s: s["sample"]) for _, p in sorted(problems.items())], ks)
            for group, problems in sorted(grouped.items())}


def flat_metrics(metrics: dict, prefix: str = "val") -> dict[str, float]:
    """metrics.jsonl's keys: `<prefix>/<group>/<metric>` the value, `.../low` and `.../high` the interval."""
    out = {}
    for group, by_metric in metrics.items():
        for name, v in by_metric.items():
            key = f"{prefix}/{group}/{name}"
            out[key], out[f"{key}/low"], out[f"{key}/high"] = v["value"], v["low"], v["high"]
    return out


def write_samples(path: Path, samples: Iterable[dict], **extra) -> None:
    with path.open("a") as f:
        for s in samples:
            f.write(json.dumps({**extra, **s}, default=str) + "\n")


def read_samples(path: Path) -> dict[str, list[dict]]:
    """samples.jsonl by checkpoint (rows without one under "")."""
    out: dict[str, list[dict]] = defaultdict(list)
    for line in Path(path).read_text().splitlines():
        if line.strip():
            row = json.loads(line)
            out[row.get("checkpoint", "")].append(row)
    return dict(out)


def _metric_order(name: str) -> tuple:
    kind, _, k = name.partition("@")
    return ({"mean": 0, "pass": 1, "maj": 2, "completed": 3, "completed_correct": 4}.get(kind, 5), int(k or 0))


def table(results: dict[str, dict]) -> str:
    """One markdown table: a row per checkpoint x group, a column per metric, `value [low, high]`."""
    names = sorted({m for by_group in results.values() for by_metric in by_group.values() for m in by_metric},
                   key=_metric_order)
    lines = ["| checkpoint | data_source | " + " | ".join(names) + " |", "|---|---|" + "---|" * len(names)]
    for checkpoint, by_group in results.items():
        for group, by_metric in by_group.items():
            cells = [f"{v['value']:.3f} [{v['low']:.3f}, {v['high']:.3f}]" if (v := by_metric.get(m)) else "-"
                     for m in names]
            lines.append(f"| {checkpoint} | {group} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot_pass_at_k(results: dict[str, dict], out: Path) -> Path | None:
    """pass@k against k, one panel per data_source, a line per checkpoint with its 95% band."""
    groups = sorted({g for by_group in results.values() for g in by_group})
    if not groups:
        return None
    import matplotlib  # heavy, and only for the picture

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(groups), figsize=(4.5 * len(groups), 3.6), squeeze=False)
    for ax, group in zip(axes[0], groups):
        for checkpoint, by_group in results.items():
            points = sorted((int(m[5:]), v) for m, v in by_group.get(group, {}).items() if m.startswith("pass@"))
            if not points:
                continue
            ks = [k for k, _ in points]
            ax.plot(ks, [v["value"] for _, v in points], marker="o", label=checkpoint)
            ax.fill_between(ks, [v["low"] for _, v in points], [v["high"] for _, v in points], alpha=0.2)
            if ks[-1] >= 8 * ks[0]:  # 1, 2, 4, ..., 64: evenly spaced, as pass@k curves are read
                ax.set_xscale("log", base=2)
            ax.set_xticks(ks, [str(k) for k in ks])
        ax.set_title(group)
        ax.set_xlabel("k (samples per problem)")
        ax.set_ylabel("pass@k (95% bootstrap band)")
        ax.set_ylim(-0.02, 1.02)
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def write_report(results: dict[str, dict], out_dir: Path) -> tuple[str, Path, Path | None]:
    """eval.json, eval.md and pass_at_k.png in `out_dir`; returns the table and the two paths."""
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / EVAL_JSON).write_text(json.dumps(results, indent=1) + "\n")
    text = table(results)
    md = out_dir / EVAL_MD
    md.write_text("# Evaluation\n\nEach cell: value [95% interval low, high]; intervals over problems (Wilson for "
                  "mean@n and the completed shares, a percentile bootstrap for pass@k and maj@k).\n\n" + text + "\n")
    return text, md, plot_pass_at_k(results, out_dir / PASS_AT_K_PNG)
