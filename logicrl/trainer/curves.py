"""The end-of-run PNG: reward and accuracy per step, read back from metrics.jsonl; a multi-turn run's also has
its tool calls (workers/rollout/multi_turn.py), so the picture shows the model learning to call."""

from __future__ import annotations

import json
from pathlib import Path

CURVES = (("critic/score/mean", "reward (mean score)"), ("reward/acc/mean", "train accuracy"),
          ("val/acc", "validation accuracy"))
# Drawn in a third panel, only for a run that logged them (multi_turn.enable=true; trainer/turns.py).
TOOL_CURVES = (("tool/calls_per_sample", "tool calls per sample"), ("num_turns/mean", "assistant turns (mean)"),
               ("tool/failure_rate", "failed call share"))


def curve_points(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """What curves.png draws: each curve's label -> its (step, value) points, from metrics.jsonl."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    return {label: [(r["step"], r[key]) for r in rows if key in r] for key, label in (*CURVES, *TOOL_CURVES)}


def plot_curves(run_dir: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")  # no display on training machines
    import matplotlib.pyplot as plt

    points = curve_points(run_dir)
    panels = [("reward", CURVES[:1]), ("accuracy", CURVES[1:])]
    if any(points[label] for _, label in TOOL_CURVES):
        panels.append(("tool calls", TOOL_CURVES))
    fig, axes = plt.subplots(1, len(panels), figsize=(5.5 * len(panels), 4))
    for ax, (title, curves) in zip(axes, panels):
        for _, label in curves:
            if points[label]:
                ax.plot(*zip(*points[label]), label=label, marker="." if len(points[label]) < 40 else None)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:  # no curve (e.g. no validation): legend() warns on stderr
            ax.legend()
        ax.set_title(title)
    fig.tight_layout()
    out = run_dir / "curves.png"
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def phase_points(run_dir: Path) -> dict[str, list[tuple[int, float]]]:
    """What phases.png draws: each phase -> its (step, seconds) points (the controller's timing_s/<phase>,
    which counts the Ray transfers; timing_s/step is their sum plus the controller's own work)."""
    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    steps = [r for r in rows if "timing_s/step" in r]
    phases = sorted({k[9:] for r in steps for k in r if k.startswith("timing_s/") and k != "timing_s/step"})
    return {p: [(r["step"], r.get(f"timing_s/{p}", 0.0)) for r in steps] for p in phases}


def plot_phases(run_dir: Path) -> Path | None:
    """phases.png: the time of each step by phase, stacked; None when no step was logged."""
    points = phase_points(run_dir)
    if not points:
        return None
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4))
    steps = [s for s, _ in next(iter(points.values()))]
    ax.stackplot(steps, *[[v for _, v in pts] for pts in points.values()], labels=list(points))
    ax.set_xlabel("step")
    ax.set_ylabel("seconds")
    ax.set_title("where each step's time goes")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=7, ncol=2)
    fig.tight_layout()
    out = run_dir / "phases.png"
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
