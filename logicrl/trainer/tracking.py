"""Where metrics go: the console, a JSONL file in the run directory, TensorBoard, wandb.

The JSONL file (every metric of every step, so curves can be redrawn without any service) and
TensorBoard are always written to the run directory; `trainer.logger` adds the console (one
compact line per step under a tqdm bar with an ETA) and wandb (when installed).

A non-finite value is written as it is (NaN, Infinity in the JSONL, as Python's json writes and
reads them; nan, inf on the console): a diverging run must show where it diverged, not drop the key.
"""

from __future__ import annotations

import json
import logging
from contextlib import ExitStack
from pathlib import Path

from logicrl.logs import lines_above

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
        self.redirect = ExitStack()
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
        if self.bar is not None:  # last, inside any console capture wandb set up
            self.redirect.enter_context(lines_above(self.bar))

    def log(self, metrics: dict, step: int) -> None:
        # Numbers only (bool is an int); NaN and inf stay: they are what a diverged step looks like.
        clean = {k: float(v) for k, v in metrics.items() if isinstance(v, (int, float))}
        try:
            self.jsonl.write(json.dumps({"step": step, **clean}) + "\n")
            self.jsonl.flush()
        except OSError as err:  # a full disk fails at the flush, which names no file: name it
            raise OSError(err.errno, err.strerror, str(self.run_dir / "metrics.jsonl")) from err
        for key, value in clean.items():
            self.tb.add_scalar(key, value, step)
        if self.wandb is not None:
            self.wandb.log(clean, step=step)
        if self.bar is not None:
            line = "  ".join(f"{short} {clean[key]:.3g}" for key, short in CONSOLE_KEYS if key in clean)
            print(f"step {step}: {line}")  # above the bar (lines_above)
            self._advance(step)

    def _advance(self, step: int) -> None:
        """The bar counts training steps, so it ends at total_steps: step 0 (validation before training)
        is not one of them, and a resumed run's bar starts where the run stands, its rate from there."""
        if step <= self.bar.n:
            return
        if self.bar.n == 0 and step > 1:
            self.bar.initial = self.bar.n = self.bar.last_print_n = step - 1
        self.bar.update(step - self.bar.n)

    def close(self) -> None:
        try:
            self.jsonl.close()
        except OSError:
            pass  # the row that failed to write is the error being raised (log); closing must not replace it
        self.redirect.close()
        if self.bar is not None:
            self.bar.close()
        self.tb.close()
        if self.wandb is not None:
            self.wandb.finish()
