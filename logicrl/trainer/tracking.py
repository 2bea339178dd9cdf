"""Where metrics go: the console, a JSONL file in the run directory, TensorBoard, wandb.

The JSONL file (every metric of every step, so curves can be redrawn without any service) and
TensorBoard are always written to the run directory; `trainer.logger` adds the console (one
compact line per step under a tqdm bar with an ETA) and wandb (when installed).
"""

from __future__ import annotations

import json
import logging
import math
from pathlib import Path

log = logging.getLogger("logicrl.trainer")

# The headline numbers, with their short names: on the console, and in each checkpoint's step history.
HEADLINE_KEYS = (
    ("critic/score/mean", "reward"),
    ("reward/acc/mean", "acc"),
    ("val/acc", "val_acc"),
)
CONSOLE_KEYS = (
    *HEADLINE_KEYS,
    ("response_length/mean", "len"),
    ("actor/pg_loss", "pg_loss"),
    ("actor/grad_norm", "gnorm"),
    ("timing_s/step", "step_s"),
)


class Tracker:
    def __init__(self, run_dir: Path, loggers: list[str], total_steps: int, config: dict, project: str,
                 experiment: str):
        self.run_dir = run_dir
        run_dir.mkdir(parents=True, exist_ok=True)  # a curriculum stage's sub-directory is new
        self.jsonl = (run_dir / "metrics.jsonl").open("a")
        self.console = "console" in loggers
        self.bar = None
        if self.console:
            from tqdm import tqdm

            self.bar = tqdm(total=total_steps, desc="steps", unit="step", dynamic_ncols=True)
        from torch.utils.tensorboard import SummaryWriter

        self.tb = SummaryWriter(str(run_dir / "tensorboard"))
        self.wandb = None
        if "wandb" in loggers:
            try:
                import wandb
            except ImportError:
                log.warning("trainer.logger has wandb but it is not installed: pip install wandb; skipping it")
            else:
                self.wandb = wandb.init(project=project, name=experiment, config=config, dir=str(run_dir))

    def log(self, metrics: dict, step: int) -> None:
        clean = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float)) and math.isfinite(v)}
        self.jsonl.write(json.dumps({"step": step, **clean}) + "\n")
        self.jsonl.flush()
        for key, value in clean.items():
            self.tb.add_scalar(key, value, step)
        if self.wandb is not None:
            self.wandb.log(clean, step=step)
        if self.bar is not None:
            line = "  ".join(f"{short} {clean[key]:.3g}" for key, short in CONSOLE_KEYS if key in clean)
            self.bar.write(f"step {step}: {line}")
            self.bar.update(1)

    def close(self) -> None:
        self.jsonl.close()
        if self.bar is not None:
            self.bar.close()
        self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()
