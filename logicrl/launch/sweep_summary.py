"""The summary of a sweep: `sweep_summary.md` and `sweep_summary.png` in the sweep directory.

One row per job, from what the job left in its directory: `result.json` (its overrides, its status
- done, refused by the memory planner with the knobs it named, or failed with the error's line -,
the device's capacity and for a dry run the planned peak of every phase) and, when it trained,
`metrics.jsonl` (steps, final reward and accuracy, validation accuracy, mean step time, measured peak
memory per phase), and a link to its `curves.png`.

The picture: when a job trained, its reward and accuracy (train, and validation dashed) against step and
against wall time (the cumulative step time), one line per job (each its own marker and width, so equal
curves do not hide each other), beside the memory bars (MB when small; measured, or planned and hatched
for a dry run), where a dashed line marks the device's capacity when it fits the bars' scale; a dry-run
sweep draws the memory bars alone.
"""

from __future__ import annotations

import json
from pathlib import Path

# The curves each job's curves.png draws (trainer/curves.py CURVES: trainer/ is launch/'s peer, not below it).
CURVES = (("critic/score/mean", "reward (mean score)"), ("reward/acc/mean", "train accuracy"),
          ("val/acc", "validation accuracy"))
RESULT = "result.json"  # each job's outcome, in its directory (launch/sweep.py write_result)
PEAK, TENSOR_PEAK = "perf/memory/", "/tensor_peak_gb"  # the measured number the plan predicts (memory/telemetry.py)


def job_rows(sweep_dir: Path) -> list[dict]:
    rows = []
    for result in sweep_dir.glob(f"*/{RESULT}"):
        row = json.loads(result.read_text())
        row.update(trained(result.parent), dir=result.parent)
        rows.append(row)
    return sorted(rows, key=lambda r: (r.get("num", 0), r["job"]))  # the sweep's own order


def trained(job_dir: Path) -> dict:
    """What the job's metrics.jsonl files say (a curriculum has one per stage)."""
    steps = [json.loads(line) for path in sorted(job_dir.rglob("metrics.jsonl"))
             for line in path.read_text().splitlines() if line.strip()]
    steps = [s for s in steps if "critic/score/mean" in s]  # val-only rows (step 0) are not steps
    if not steps:
        return {}
    val = [s["val/acc"] for s in steps if "val/acc" in s]
    peaks: dict[str, float] = {}
    for s in steps:
        for key, value in s.items():
            if key.startswith(PEAK) and key.endswith(TENSOR_PEAK):
                phase = key[len(PEAK):-len(TENSOR_PEAK)]
                peaks[phase] = max(peaks.get(phase, 0.0), float(value))
    times = [s["timing_s/step"] for s in steps if "timing_s/step" in s]
    curves = job_dir / "curves.png"
    return {"steps": len(steps), "reward": steps[-1]["critic/score/mean"], "acc": steps[-1].get("reward/acc/mean"),
            "val_acc": val[-1] if val else None, "step_s": sum(times) / len(times) if times else None,
            "peak_gb": peaks, "curves": f"{job_dir.name}/curves.png" if curves.is_file() else None}


def learning_points(job_dir: Path) -> dict[str, list[tuple[int, float, float]]]:
    """Each curve's (step, wall seconds, value) points for one job: CURVES's reward and accuracies, the wall
    time being the steps' cumulative timing_s/step (validation before training at 0 s)."""
    rows = [json.loads(line) for path in sorted(job_dir.rglob("metrics.jsonl"))
            for line in path.read_text().splitlines() if line.strip()]
    points: dict[str, list[tuple[int, float, float]]] = {label: [] for _, label in CURVES}
    wall = 0.0
    for row in rows:
        wall += row.get("timing_s/step", 0.0)
        for key, label in CURVES:
            if key in row:
                points[label].append((row["step"], round(wall, 3), row[key]))
    return points


def _num(value, fmt: str = "{:.3f}") -> str:
    return "" if value is None else fmt.format(value)


def table(rows: list[dict]) -> str:
    phases = sorted({p for r in rows for p in (r.get("peak_gb") or r.get("planned_peak_gb") or {})})
    head = ["job", "status", "steps", "reward", "acc", "val acc", "step s", *(f"{p} GB" for p in phases), "curves",
            "detail"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        peaks = r.get("peak_gb") or r.get("planned_peak_gb") or {}
        status = {"done": "done (planned)" if r.get("dry_run") else "done",
                  "refused": "refused by the planner"}.get(r["status"], r["status"])
        detail = r.get("detail", "")  # a refusal's line names the knobs that make it fit
        cells = [r["job"], status, _num(r.get("steps"), "{}"), _num(r.get("reward")), _num(r.get("acc")),
                 _num(r.get("val_acc")), _num(r.get("step_s"), "{:.2f}"),
                 *(_num(peaks.get(p), "{:.2f}") for p in phases),
                 f"[curves.png]({r['curves']})" if r.get("curves") else "", detail.replace("|", "\\|")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


# The capacity line is drawn only while the bars stay readable under it: past this ratio (a tiny CPU run under
# 20 GB of RAM) the bars would be a few pixels high, so the capacity is written in the title instead.
CAPACITY_ON_SCALE = 20
MARKERS = "os^Dv<>p"  # one per job, so jobs whose curves coincide stay visible under each other


def _memory_bars(ax, rows: list[dict]) -> None:
    """Peak memory per phase for each job, measured where it ran and planned for a dry run (hatched), in MB
    when every bar is under 1 GB; the device's capacity dashed where it fits the scale, else in the title."""
    phases = sorted({p for r in rows for p in (r.get("peak_gb") or r.get("planned_peak_gb") or {})})
    peaks = [max((r.get("peak_gb") or r.get("planned_peak_gb") or {}).values(), default=0.0) for r in rows]
    unit, scale = ("MB", 1024.0) if max(peaks, default=0.0) < 1.0 else ("GB", 1.0)
    width = 0.8 / max(1, len(phases))
    for i, phase in enumerate(phases):
        values = [(r.get("peak_gb") or r.get("planned_peak_gb") or {}).get(phase, 0.0) * scale for r in rows]
        hatches = ["//" if r.get("dry_run") else "" for r in rows]
        bars = ax.bar([j + i * width for j in range(len(rows))], values, width, label=phase, color=f"C{i}")
        for bar, hatch in zip(bars, hatches):
            bar.set_hatch(hatch)
    capacity = min((r["capacity_gb"] for r in rows if r.get("capacity_gb")), default=None)
    device = rows[0].get("device", "device")
    off_scale = ""
    if capacity is not None and capacity <= CAPACITY_ON_SCALE * max(max(peaks, default=0.0), 1e-9):
        ax.axhline(capacity * scale, color="red", linestyle="--", linewidth=1,
                   label=f"capacity {capacity:.1f} GB ({device})")
    elif capacity is not None:
        off_scale = f"\ncapacity {capacity:.1f} GB ({device}) is off this scale"
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(rows))])
    ax.set_xticklabels([r["job"] + ("" if r["status"] == "done" else f"\n({r['status']})") for r in rows],
                       rotation=20, ha="right", fontsize=8)
    ax.set_xlabel("job (its swept values)")
    ax.set_ylabel(f"peak memory per device ({unit})")
    measured = [not r.get("dry_run") for r in rows]
    what = "measured" if all(measured) else "planned (dry run)" if not any(measured) else \
        "measured; hatched: planned (dry run)"
    ax.set_title(f"peak memory per phase, {what}{off_scale}", fontsize=9)
    if phases or capacity:
        ax.legend(fontsize=7)


def plot(rows: list[dict], path: Path) -> dict[str, dict[str, list[tuple[float, float]]]]:
    """The memory bars, and beside them each trained job's learning curves (module docstring). Returns what
    was drawn, read back from the figure: each panel's title -> each line's label -> its (x, y) points."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    curves = {r["job"]: learning_points(r["dir"]) for r in rows if r.get("steps")}
    if not curves:  # a dry run (or nothing trained): the memory picture alone
        fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(rows) + 2), 4))
        _memory_bars(ax, rows)
        ax.set_title("sweep: " + ax.get_title(), fontsize=9)
    else:
        fig, axes = plt.subplots(2, 3, figsize=(16, 8))
        for row, (x, xlabel) in enumerate(((0, "step"), (1, "wall time (s, cumulative step time)"))):
            for col, labels in enumerate((("reward (mean score)",), ("train accuracy", "validation accuracy"))):
                ax = axes[row][col]
                for n, (job, points) in enumerate(curves.items()):
                    for label in labels:
                        if points[label]:
                            style = "--" if label == "validation accuracy" else "-"
                            # Later jobs thinner and marked differently: identical curves stay visible.
                            line = points[label]
                            ax.plot([p[x] for p in line], [p[2] for p in line], style, color=f"C{n}",
                                    marker=MARKERS[n % len(MARKERS)], markevery=max(1, len(line) // 20),
                                    markersize=max(3.0, 8.0 - 1.5 * n), linewidth=max(1.0, 4.0 - n), alpha=0.85,
                                    label=f"{job}" + (" (val)" if style == "--" else ""))
                ax.set_xlabel(xlabel)
                ax.set_ylabel("reward (mean score)" if col == 0 else "accuracy")
                what = "reward" if col == 0 else "accuracy (validation dashed)"
                ax.set_title(f"{what} vs {xlabel.split(' (')[0]}")
                ax.grid(alpha=0.3)
                if ax.get_legend_handles_labels()[0]:
                    ax.legend(fontsize=7)
        gs = axes[0][2].get_gridspec()
        for ax in axes[:, 2]:
            ax.remove()
        _memory_bars(fig.add_subplot(gs[:, 2]), rows)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    drawn = {ax.get_title(): {line.get_label(): [tuple(map(float, xy)) for xy in line.get_xydata()]
                              for line in ax.get_lines()} for ax in fig.axes}
    plt.close(fig)
    return drawn


def write_summary(sweep_dir: Path) -> int:
    """Write the summary; return how many jobs did not finish (refused or failed)."""
    rows = job_rows(sweep_dir)
    if not rows:
        return 0
    not_done = sum(r["status"] != "done" for r in rows)
    text = (f"# Sweep summary\n\n{len(rows)} job(s): {len(rows) - not_done} done, "
            f"{sum(r['status'] == 'refused' for r in rows)} refused by the memory planner, "
            f"{sum(r['status'] == 'failed' for r in rows)} failed.\n\n{table(rows)}\n\n"
            "Job directories are named by the swept values; each holds its run's logs and `result.json`.\n")
    (sweep_dir / "sweep_summary.md").write_text(text)
    plot(rows, sweep_dir / "sweep_summary.png")
    print(f"logicrl sweep: {len(rows)} job(s), {not_done} not done; summary in {sweep_dir / 'sweep_summary.md'}")
    print(table(rows))
    return not_done
