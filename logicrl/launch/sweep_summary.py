"""The summary of a sweep: `sweep_summary.md` and `sweep_summary.png` in the sweep directory.

One row per job, from what the job left in its directory: `result.json` (its overrides, its status
- done, refused by the memory planner with the knobs it named, or failed with the error's line -
and for a dry run the planned peak of every phase) and, when it trained, `metrics.jsonl` (steps,
final reward and accuracy, validation accuracy, mean step time, measured peak memory per phase).
"""

from __future__ import annotations

import json
from pathlib import Path

RESULT = "result.json"  # each job's outcome, in its directory (launch/sweep.py write_result)
PEAK, TENSOR_PEAK = "perf/memory/", "/tensor_peak_gb"  # the measured number the plan predicts (memory/telemetry.py)


def job_rows(sweep_dir: Path) -> list[dict]:
    rows = []
    for result in sweep_dir.glob(f"*/{RESULT}"):
        row = json.loads(result.read_text())
        row.update(trained(result.parent))
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
    return {"steps": len(steps), "reward": steps[-1]["critic/score/mean"], "acc": steps[-1].get("reward/acc/mean"),
            "val_acc": val[-1] if val else None, "step_s": sum(times) / len(times) if times else None,
            "peak_gb": peaks}


def _num(value, fmt: str = "{:.3f}") -> str:
    return "" if value is None else fmt.format(value)


def table(rows: list[dict]) -> str:
    phases = sorted({p for r in rows for p in (r.get("peak_gb") or r.get("planned_peak_gb") or {})})
    head = ["job", "status", "steps", "reward", "acc", "val acc", "step s", *(f"{p} GB" for p in phases), "detail"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in rows:
        peaks = r.get("peak_gb") or r.get("planned_peak_gb") or {}
        status = {"done": "done (planned)" if r.get("dry_run") else "done",
                  "refused": "refused by the planner"}.get(r["status"], r["status"])
        detail = r.get("detail", "")  # a refusal's line names the knobs that make it fit
        cells = [r["job"], status, _num(r.get("steps"), "{}"), _num(r.get("reward")), _num(r.get("acc")),
                 _num(r.get("val_acc")), _num(r.get("step_s"), "{:.2f}"), *(_num(peaks.get(p), "{:.2f}") for p in phases),
                 detail.replace("|", "\\|")]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def plot(rows: list[dict], path: Path) -> None:
    """Peak memory per phase for each job (planned in a dry run, measured otherwise); the jobs that
    did not run are marked on the axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    phases = sorted({p for r in rows for p in (r.get("peak_gb") or r.get("planned_peak_gb") or {})})
    fig, ax = plt.subplots(figsize=(max(6.0, 1.2 * len(rows) + 2), 4))
    width = 0.8 / max(1, len(phases))
    for i, phase in enumerate(phases):
        values = [(r.get("peak_gb") or r.get("planned_peak_gb") or {}).get(phase, 0.0) for r in rows]
        ax.bar([j + i * width for j in range(len(rows))], values, width, label=phase)
    ax.set_xticks([j + 0.4 - width / 2 for j in range(len(rows))])
    ax.set_xticklabels([r["job"] + ("" if r["status"] == "done" else f"\n({r['status']})") for r in rows],
                       rotation=20, ha="right", fontsize=8)
    ax.set_ylabel("peak memory per device (GB)")
    ax.set_title("sweep: peak memory per phase" + (" (planned)" if all(r.get("dry_run") for r in rows) else ""))
    if phases:
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


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
