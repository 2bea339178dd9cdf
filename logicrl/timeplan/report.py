"""The time plan as printed before a run, and checked against the run after it.

    plan = time_plan(cfg, spec, step_plan, device)   # seconds per phase; None when it cannot be made
    print(plan_line(plan, total_steps))             # "time plan: 0.52 s/step (generate 0.15, ...); ..."
    print(time_report(plan.phases, run_dir))        # the closing table, and a line for a phase off by > 2x

Prompts are planned at the mean token count of a sample of the training rows (memory/lengths.py, as the
expected memory plan reads them; MEAN_ROWS a file for a mean) where the tokenizer loads, else at
data.max_prompt_length; responses at the memory plan's response length. Pure arithmetic but for the first
CPU calibration on a machine.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import statistics
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig

from logicrl.config.errors import ConfigError
from logicrl.config.plan import StepPlan
from logicrl.memory.lengths import EXPECTED, expected_response, measured_prompt_lengths
from logicrl.models.spec import ModelSpec
from logicrl.timeplan.calibrate import cpu_rates
from logicrl.timeplan.devices import DEVICES
from logicrl.timeplan.devices import device as device_row
from logicrl.timeplan.predict import Rates, predict
from logicrl.timeplan.split import SplitEstimate, split_estimate, split_line

log = logging.getLogger("logicrl.timeplan")
OFF_BY = 2.0  # a phase measured more than this factor away from its plan gets a line of its own
CONTROLLER = ("reward", "advantages")  # phases on the controller: summed as "other" in the line
MEAN_ROWS = 256  # rows per file whose mean prompt length the plan takes (see _prompt_tokens)


@dataclass(frozen=True)
class TimePlan:
    phases: dict[str, float]  # seconds per step
    rates: Rates
    prompt: int
    response: int
    split: SplitEstimate | None = None  # separate groups: their step against the colocated one (split.py)

    @property
    def step_s(self) -> float:
        return self.split.step_s if self.split else sum(self.phases.values())

    @property
    def compared(self) -> dict[str, float]:
        """The phases as a run measures them: on separate groups the sync is timing_s/sync_weights, the
        broadcast over the link included (split.py)."""
        if not self.split:
            return self.phases
        return {**{p: s for p, s in self.phases.items() if p != "update_weights"}, "sync_weights": self.split.sync_s}


def rates_for(device: str, ranks_per_node: int, gpu_model: str | None = None) -> Rates | None:
    """The device table's row on CUDA (`gpu_model`'s, else the first visible GPU's; None for a GPU it does not
    know), the calibration on CPU."""
    if device == "cuda":
        if gpu_model:
            if (row := device_row(gpu_model)) is None:
                raise ConfigError(f"trainer.gpu_model={gpu_model} is not in the time plan's device table: name one "
                                  f"of {', '.join(d.name for d in DEVICES)} (logicrl/timeplan/devices.py)")
            return Rates(gpu=row)
        import torch

        row = device_row(torch.cuda.get_device_name(0)) if torch.cuda.is_available() else None
        return Rates(gpu=row) if row else None
    rates, _ = cpu_rates(cpu_threads(ranks_per_node))
    return Rates(cpu=rates)


def cpu_threads(ranks_per_node: int) -> int:
    """The threads one CPU rank gets: OMP_NUM_THREADS where set, else this machine's CPUs shared by its ranks
    (controller/placement.py threads_per_rank)."""
    cpus = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    return int(os.environ.get("OMP_NUM_THREADS") or 0) or max(1, cpus // max(1, ranks_per_node))


def _prompt_tokens(cfg: DictConfig) -> int:
    # A mean needs far fewer rows than the memory plan's longest prompt: unless that plan measured the preflight's
    # sample already (memory_plan=expected), MEAN_ROWS (every launch rendered and tokenized 2000 prompts for it).
    rows = None if cfg.trainer.memory_plan == EXPECTED else MEAN_ROWS
    try:
        return max(1, round(statistics.fmean(measured_prompt_lengths(cfg, rows))))
    except (ConfigError, OSError, ValueError):  # no tokenizer to measure with: plan for full prompts
        return int(cfg.data.max_prompt_length)


def time_plan(cfg: DictConfig, spec: ModelSpec, plan: StepPlan, device: str) -> TimePlan | None:
    # CPU ranks of separate groups share this machine's cores with the trainer's (controller/placement.py).
    ranks = min(plan.ranks, cfg.trainer.n_gpus_per_node or plan.ranks) + (plan.rollout_ranks if device == "cpu" else 0)
    rates = rates_for(device, ranks, cfg.trainer.gpu_model)
    if rates is None:
        return None
    prompt, (response, _) = _prompt_tokens(cfg), expected_response(cfg)
    return TimePlan(predict(cfg, spec, plan, rates, prompt, response), rates, prompt, response,
                    split_estimate(cfg, spec, plan, rates, prompt, response))


def _duration(seconds: float) -> str:
    seconds = round(seconds)
    h, m, s = seconds // 3600, seconds % 3600 // 60, seconds % 60
    return f"{h}h{m:02d}m" if h else f"{m}m{s:02d}s" if m else f"{s}s"


def plan_line(plan: TimePlan | None, steps: int, now: datetime.datetime | None = None) -> str:
    if plan is None:
        return ("time plan: none (no GPU here, or one the device table does not know: timeplan/devices.py; "
                "trainer.gpu_model names the one to plan for)")
    worker = sorted(((p, s) for p, s in plan.phases.items() if p not in CONTROLLER), key=lambda kv: -kv[1])
    other = sum(s for p, s in plan.phases.items() if p in CONTROLLER)
    parts = ", ".join(f"{p} {s:.3g}" for p, s in worker) + (f", other {other:.2g}" if other else "")
    total = plan.step_s * steps
    now = now or datetime.datetime.now(datetime.UTC)
    eta = (now + datetime.timedelta(seconds=total)).strftime("%H:%M UTC")
    line = (f"time plan: {plan.step_s:.3g} s/step ({parts}); {steps} steps: {_duration(total)}, ETA {eta}; "
            f"prompts {plan.prompt} + responses {plan.response} tokens; {plan.rates.describe()}")
    return line + (f"\ntime plan, {split_line(plan.split)}" if plan.split else "")


def measured_phases(run_dir: Path) -> tuple[dict[str, float], int]:
    """Each phase's median seconds per step over the steps after the first (its warm-up), and the steps."""
    rows = [json.loads(line) for path in sorted(Path(run_dir).rglob("metrics.jsonl"))
            for line in path.read_text().splitlines() if line.strip()]
    steps = [r for r in rows if "timing_s/step" in r]
    steps = steps[1:] if len(steps) > 2 else steps
    keys = {k for r in steps for k in r if k.startswith("timing_s/") and k not in ("timing_s/step", "timing_s/save")}
    out = {k[len("timing_s/"):]: statistics.median(r.get(k, 0.0) for r in steps) for k in keys}
    if steps:
        out["step"] = statistics.median(r["timing_s/step"] for r in steps)
    return out, len(steps)


def time_report(planned: dict[str, float], run_dir: Path, step_s: float | None = None) -> str | None:
    """Planned vs measured seconds per phase (median step), and one line naming any phase off by > 2x;
    `step_s`: the planned step where it is not the phases' sum (separate groups overlap them)."""
    measured, n = measured_phases(run_dir)
    if not n:
        return None
    planned = {**planned, "step": sum(planned.values()) if step_s is None else step_s}
    lines = [f"time per step (s): planned vs measured (median of {n} step(s), the first left out)",
             f"{'phase':<16}{'planned':>9}{'measured':>10}{'ratio':>8}"]
    off = []
    for phase in [*(p for p in planned if p != "step"), *(p for p in measured if p not in planned), "step"]:
        p, m = planned.get(phase), measured.get(phase)
        ratio = m / p if p and m is not None else None
        lines.append(f"{phase:<16}{'-' if p is None else f'{p:.3f}':>9}{'-' if m is None else f'{m:.3f}':>10}"
                     f"{'-' if ratio is None else f'{ratio:.2f}':>8}")
        significant = m is not None and p is not None and max(m, p) >= 0.05 * planned["step"]
        if ratio is not None and significant and not 1 / OFF_BY <= ratio <= OFF_BY and phase != "step":
            off.append(f"{phase} ({'slower' if ratio > 1 else 'faster'} by {max(ratio, 1 / ratio):.1f}x)")
    if off:
        lines.append(f"time plan off by more than {OFF_BY:.0f}x: {', '.join(off)}")
    return "\n".join(lines)
