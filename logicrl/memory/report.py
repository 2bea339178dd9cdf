"""The run's closing memory table: each phase's planned peak beside what the run measured.

    print(memory_report(planned_gb, run_dir))   # main_ppo, after training (CPU and CUDA alike)

`tensor peak` is the number the plan predicts, measured (memory/telemetry.py: torch's counter with the
engine's pool on CUDA, live tensor bytes on the steps that track them on CPU); the last column is the
whole process as the OS or the driver sees it (RSS on CPU, total - free on CUDA), which also holds what no
plan counts (Python, libraries, the CUDA context, the allocator's free lists). Pure: no torch import.
"""

from __future__ import annotations

import json
from pathlib import Path

PREFIX = "perf/memory/"
TENSOR, RSS, DEVICE_USED = "tensor_peak_gb", "rss_peak_gb", "device_used_gb"


def measured_peaks(rows: list[dict]) -> dict[str, dict[str, float]]:
    """phase -> {metric name: its largest value over the rows}, for the perf/memory/<phase>/<name> keys."""
    out: dict[str, dict[str, float]] = {}
    for row in rows:
        for key, value in row.items():
            if key.startswith(PREFIX) and key.count("/") == 3:
                phase, name = key[len(PREFIX):].split("/")
                peaks = out.setdefault(phase, {})
                peaks[name] = max(peaks.get(name, 0.0), float(value))
    return out


def report_table(planned: dict[str, float], measured: dict[str, dict[str, float]]) -> str:
    """The table, one row per planned phase (the plan's order), then any measured phase it did not plan."""
    cuda = any(DEVICE_USED in m for m in measured.values())
    whole, whole_key = ("device used", DEVICE_USED) if cuda else ("process RSS", RSS)
    lines = [f"memory per device (GB): planned vs measured; tensor peak is what the plan predicts, {whole} "
             "is the whole " + ("device" if cuda else "process"),
             f"{'phase':<16}{'planned':>9}{'tensor peak':>13}{whole:>13}"]
    for phase in [*planned, *(p for p in measured if p not in planned)]:
        got = measured.get(phase, {})
        cells = [planned.get(phase), got.get(TENSOR), got.get(whole_key)]
        lines.append(f"{phase:<16}" + "".join(f"{'-' if v is None else f'{v:.3f}':>{w}}"
                                              for v, w in zip(cells, (9, 13, 13))))
    return "\n".join(lines)


def memory_report(planned: dict[str, float], run_dir: Path) -> str | None:
    """The table for the run under `run_dir` (every metrics.jsonl below it: a curriculum has one per stage);
    None when nothing was measured (no step ran)."""
    rows = [json.loads(line) for path in sorted(Path(run_dir).rglob("metrics.jsonl"))
            for line in path.read_text().splitlines() if line.strip()]
    measured = measured_peaks(rows)
    return report_table(planned, measured) if measured else None
