"""The run's closing memory table: each phase's planned peak beside what the run measured.

    print(memory_report(planned_gb, run_dir, plans.peaks_gb_at))   # main_ppo, after training (CPU and CUDA)

`tensor peak` is the number the plan predicts, measured (memory/telemetry.py: torch's counter with the
engine's pool on CUDA, live tensor bytes on the steps that track them on CPU). The preflight plans full
lengths (or expected ones) at the configured micro-batches, while a run's prompts and responses are often
shorter and an OOM retry halves a micro-batch: the table plans again for what the measured steps ran
(RunShape) and compares the peak with that plan, like with like (`peak/plan`). The last column is the whole
process as the OS or the driver sees it (RSS on CPU, total - free on CUDA), which also holds what no plan
counts (Python, libraries, the CUDA context, the allocator's free lists). Pure: no torch import.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

PREFIX = "perf/memory/"
TENSOR, RSS, DEVICE_USED = "tensor_peak_gb", "rss_peak_gb", "device_used_gb"
PROMPT_MAX, RESPONSE_MAX, MICRO = "prompt_length/max", "response_length/max", "perf/micro_size/"


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


@dataclass(frozen=True)
class RunShape:
    """What the steps that measured a tensor peak ran: the longest prompt and response, and each phase's
    largest micro-batch (rows, or a token budget: perf/micro_size/<phase>, which an OOM retry halves)."""

    prompt: int
    response: int
    micro: dict[str, int]
    steps: tuple[int, ...] = ()  # the tracked steps


def run_shape(rows: list[dict]) -> RunShape | None:
    """The RunShape of the tracked steps; None when none of them recorded its lengths (a run from before
    prompt_length/* was logged)."""
    tracked = [row for row in rows if PROMPT_MAX in row and RESPONSE_MAX in row
               and any(key.startswith(PREFIX) and key.endswith(f"/{TENSOR}") for key in row)]
    if not tracked:
        return None
    micro: dict[str, int] = {}
    for row in tracked:
        for key, value in row.items():
            if key.startswith(MICRO):
                phase = key[len(MICRO):]
                micro[phase] = max(micro.get(phase, 0), int(value))
    return RunShape(int(max(row[PROMPT_MAX] for row in tracked)), int(max(row[RESPONSE_MAX] for row in tracked)),
                    micro, tuple(int(row["step"]) for row in tracked if "step" in row))


def report_table(planned: dict[str, float], measured: dict[str, dict[str, float]],
                 at_run: dict[str, float] | None = None, shape: RunShape | None = None) -> str:
    """The table, one row per planned phase (the plan's order), then any measured phase it did not plan.
    `at_run`: the plan at the run's `shape`, which `peak/plan` divides by; without it the preflight's plan."""
    cuda = any(DEVICE_USED in m for m in measured.values())
    whole, whole_key = ("device used", DEVICE_USED) if cuda else ("process RSS", RSS)
    lines = [f"memory per device (GB): planned vs measured; tensor peak is what the plan predicts, {whole} "
             "is the whole " + ("device" if cuda else "process")]
    if at_run is not None:
        lines.append(f"at run's lengths: the same plan at the longest prompt and response of the measured steps "
                     f"({shape.prompt} + {shape.response} tokens) and the micro-batches they ran; peak/plan is the "
                     "tensor peak over it")
        if shape.steps == (1,):
            # The plan is the steady state (planner.py); a short run tracks step 1 alone (telemetry.py).
            lines.append("step 1 alone was measured: the plan at the run's lengths leaves out the optimizer's states "
                         "before the first update, which do not exist yet")
    compared = planned if at_run is None else at_run
    # (title, width, format) per column
    columns = [("planned", 9, ".3f"), *([("at run's lengths", 18, ".3f")] if at_run is not None else []),
               ("tensor peak", 13, ".3f"), ("peak/plan", 11, ".2f"), (whole, 13, ".3f")]
    lines.append(f"{'phase':<16}" + "".join(f"{title:>{width}}" for title, width, _ in columns))
    for phase in [*planned, *(p for p in measured if p not in planned)]:
        got = measured.get(phase, {})
        peak, plan = got.get(TENSOR), compared.get(phase)
        ratio = peak / plan if peak is not None and plan else None
        cells = [planned.get(phase), *([at_run.get(phase)] if at_run is not None else []), peak, ratio,
                 got.get(whole_key)]
        lines.append(f"{phase:<16}" + "".join(f"{'-' if v is None else format(v, fmt):>{width}}"
                                              for v, (_, width, fmt) in zip(cells, columns)))
    return "\n".join(lines)


def memory_report(planned: dict[str, float], run_dir: Path,
                  plan_at: Callable[[RunShape], dict[str, float]] | None = None) -> str | None:
    """The table for the run under `run_dir` (every metrics.jsonl below it: a curriculum has one per stage);
    None when nothing was measured (no step ran). `plan_at`: the plan's peaks for what the measured steps
    ran (preflight's Plans.peaks_gb_at)."""
    rows = [json.loads(line) for path in sorted(Path(run_dir).rglob("metrics.jsonl"))
            for line in path.read_text().splitlines() if line.strip()]
    measured = measured_peaks(rows)
    if not measured:
        return None
    shape = run_shape(rows)
    at_run = plan_at(shape) if plan_at is not None and shape else None
    return report_table(planned, measured, at_run, shape)
