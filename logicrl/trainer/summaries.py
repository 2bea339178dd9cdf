"""Curriculum summaries: a table of the stages (console + markdown) and one PNG across stages.

Built from each stage's step history as its final checkpoint recorded it (`history_row`, one row a
step), so a curriculum resumed over several launches still summarises every step.
"""

from __future__ import annotations

import logging
import statistics
from pathlib import Path

from logicrl.config.stages import Stage
from logicrl.trainer.tracking import HEADLINE_KEYS

log = logging.getLogger("logicrl.trainer")
SUMMARY_MD = "curriculum_summary.md"
SUMMARY_PNG = "curriculum_curves.png"
LAST_STEPS = 10  # "final reward" averages this many last steps: one step of 8 prompts is noise


def history_row(step: int, metrics: dict) -> dict:
    """What a checkpoint keeps of each step, for stage summaries and resume checks (small, JSON)."""
    row = {"step": step}
    # Response lengths too: trainer.memory_plan=expected plans a resumed run for them (memory/lengths.py), so a
    # multi-turn run keeps its whole trajectories' (tool output takes memory as sampled tokens do).
    whole = "trajectory_length" if "trajectory_length/mean" in metrics else "response_length"
    for key, name in (*HEADLINE_KEYS, (f"{whole}/mean", "len_mean"), (f"{whole}/max", "len_max")):
        if key in metrics:
            row[name] = float(metrics[key])
    # Accuracy per validation set (data_source, people count): a curriculum's picture shows each stage's data.
    row.update({key: float(v) for key, v in metrics.items()
                if key.startswith("val/") and key.endswith("/acc") and key != "val/acc"})
    return row


def _last(history: list[dict], key: str) -> float | None:
    values = [row[key] for row in history if key in row]
    return values[-1] if values else None


def stage_row(stage: Stage, history: list[dict], elapsed_s: float, final_checkpoint: Path) -> dict:
    rewards = [row["reward"] for row in history if "reward" in row]
    return {
        "index": stage.index, "name": stage.name, "steps": len(rewards), "time_s": round(elapsed_s, 3),
        "train_batch_size": stage.plan.prompts, "rollout_n": stage.plan.n,
        "final_reward": statistics.mean(rewards[-LAST_STEPS:]) if rewards else None,
        "val_acc": _last(history, "val_acc"), "final_checkpoint": str(final_checkpoint), "history": history,
    }


def _fmt(value, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def summary_table(stages: list[Stage], done: dict) -> str:
    lines = [f"| stage | name | steps | time (s) | batch x n | reward (mean of last {LAST_STEPS} steps) "
             "| val acc (last) |",
             "|---|---|---|---|---|---|---|"]
    for stage in stages:
        row = done.get(stage.name)
        if row is None:
            lines.append(f"| {stage.index + 1} | {stage.name} | not run | | | | |")
            continue
        lines.append(f"| {stage.index + 1} | {row['name']} | {row['steps']} | {row['time_s']:.1f} "
                     f"| {row['train_batch_size']} x {row['rollout_n']} | {_fmt(row['final_reward'], '.3f')} "
                     f"| {_fmt(row['val_acc'], '.3f')} |")
    total_steps = sum(r["steps"] for r in done.values())
    total_time = sum(r["time_s"] for r in done.values())
    lines.append(f"| all | | {total_steps} | {total_time:.1f} | | | |")
    return "\n".join(lines)


def plot_stages(stages: list[Stage], done: dict, out: Path) -> Path:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax_r, ax_v) = plt.subplots(1, 2, figsize=(12, 4))
    offset = 0
    # Accuracy per validation set (history_row: val/<source>[/<k>ppl]/acc), when recorded.
    val_sets = sorted({k for r in done.values() for h in r["history"] for k in h if k.startswith("val/")})
    val_points: dict[str, list] = {key: [] for key in val_sets}
    for stage in stages:
        row = done.get(stage.name)
        if row is None:
            continue
        hist = row["history"]
        for ax, key in ((ax_r, "reward"), (ax_v, "val_acc")):
            points = [(offset + h["step"], h[key]) for h in hist if key in h]
            if points and (ax is ax_r or not val_sets):
                ax.plot(*zip(*points), marker="." if len(points) < 40 else None, label=stage.name)
        for key in val_sets:  # one line per validation set across the stages, so stage 1's effect on stage 2's shows
            val_points[key] += [(offset + h["step"], h[key]) for h in hist if key in h]
        for ax in (ax_r, ax_v):
            if offset:  # a boundary between the previous stage and this one
                ax.axvline(offset, color="gray", linestyle="--", linewidth=1)
            ax.annotate(stage.name, (offset, 1.0), xycoords=("data", "axes fraction"), fontsize=8,
                        va="top", ha="left", xytext=(2, -2), textcoords="offset points")
        offset += max([h["step"] for h in hist], default=0)
    for key, points in val_points.items():
        if points:
            ax_v.plot(*zip(*sorted(points)), marker=".", label=key[len("val/"):-len("/acc")])
    ax_r.set_title("reward (mean score) per step")
    ax_v.set_title("validation accuracy")
    for ax in (ax_r, ax_v):
        ax.set_xlabel("step (across stages)")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:  # no curve (e.g. no validation): legend() warns on stderr
            ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out, dpi=100)
    plt.close(fig)
    return out


def write_summaries(stages: list[Stage], done: dict, run_dir: Path) -> tuple[Path, Path]:
    run_dir.mkdir(parents=True, exist_ok=True)
    table = summary_table(stages, done)
    print(f"logicrl: curriculum, {len(done)}/{len(stages)} stages done\n{table}")
    md = run_dir / SUMMARY_MD
    md.write_text(f"# Curriculum summary\n\n{table}\n")
    png = plot_stages(stages, done, run_dir / SUMMARY_PNG)
    log.info(f"curriculum summary: {md}, {png}")
    return md, png
