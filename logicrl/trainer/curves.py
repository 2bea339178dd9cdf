"""The end-of-run PNG: reward and accuracy per step, read back from metrics.jsonl."""

from __future__ import annotations

import json
from pathlib import Path

CURVES = (("critic/score/mean", "reward (mean score)"), ("reward/acc/mean", "train accuracy"),
          ("val/acc", "validation accuracy"))


def plot_curves(run_dir: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")  # no display on training machines
    import matplotlib.pyplot as plt

    rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines() if line.strip()]
    fig, axes = plt.subplots(1, 2, figsize=(11, 4))
    for ax, keys in ((axes[0], CURVES[:1]), (axes[1], CURVES[1:])):
        for key, label in keys:
            points = [(r["step"], r[key]) for r in rows if key in r]
            if points:
                ax.plot(*zip(*points), label=label, marker="." if len(points) < 40 else None)
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
        ax.legend()
    axes[0].set_title("reward")
    axes[1].set_title("accuracy")
    fig.tight_layout()
    out = run_dir / "curves.png"
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out
