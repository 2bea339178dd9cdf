"""Runs a curriculum's stages in order, each from the last one's final weights, resumably.

The record of finished stages is `<trainer.default_local_dir>/curriculum.json`, written atomically
after a stage's final checkpoint is committed. Re-running the same command skips the stages it
lists, and the first unfinished stage resumes from its own newest complete checkpoint (or starts
from the previous stage's final one): after a crash at any point the curriculum continues at the
right stage and step. `trainer.resume_mode=disable` ignores the record and starts over.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from logicrl.config.plan import ARR
from logicrl.config.errors import ConfigError
from logicrl.config.stages import Stage
from logicrl.faults import Faults
from logicrl.trainer.checkpoint import complete_checkpoints, damage, write_durably
from logicrl.trainer.ppo import PPOTrainer
from logicrl.trainer.summaries import stage_row, write_summaries

log = logging.getLogger("logicrl.trainer")
RECORD_FILE = "curriculum.json"
RECORD_FORMAT = 1


def read_record(root: Path, stages: list[Stage]) -> dict:
    """{stage name: its row} of the stages already finished under `root`."""
    path = root / RECORD_FILE
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    names = [s.name for s in stages]
    if data.get("format") != RECORD_FORMAT or data.get("stages") != names:
        raise ConfigError(f"{path} records a curriculum with stages {data.get('stages')}, this one has {names}: "
                          "use another trainer.default_local_dir, or trainer.resume_mode=disable to start over")
    return data["done"]


def write_record(root: Path, stages: list[Stage], done: dict) -> None:
    root.mkdir(parents=True, exist_ok=True)
    payload = {"format": RECORD_FORMAT, "stages": [s.name for s in stages], "done": done}
    write_durably(root / RECORD_FILE, json.dumps(payload, indent=1))


def finished_step(row: dict) -> int:
    """The step a finished stage ended at: its final checkpoint's global_step_N."""
    return int(Path(row["final_checkpoint"]).name.rpartition("_")[2])


def reopen_lengthened(stages: list[Stage], done: dict) -> None:
    """A finished stage that now has more steps (a longer total_training_steps or more epochs)
    continues from its own last checkpoint, as a plain run does; so it is taken off the record.
    Not when a later stage already trained from its end: that would mean retraining those."""
    for stage in stages:
        row = done.get(stage.name)
        if row is None or finished_step(row) >= stage.plan.total_steps:
            continue
        later = [s.name for s in stages[stage.index + 1:] if s.name in done]
        if later:
            raise ConfigError(f"stage {stage.name} now has {stage.plan.total_steps} steps but finished at "
                              f"{finished_step(row)}, and stage(s) {', '.join(later)} trained from its end: lengthen "
                              f"only the last finished stage, or start over with trainer.resume_mode=disable")
        log.info(f"stage {stage.index + 1}/{len(stages)} ({stage.name}) finished at step {finished_step(row)} and now "
                 f"has {stage.plan.total_steps}: continuing it")
        del done[stage.name]


def run_curriculum(stages: list[Stage], root: Path, run_dir: Path, carry_optimizer: bool, resume: bool,
                   faults: Faults | None = None) -> dict:
    """Train every stage; returns {stage name: summary row}. Summaries go to `run_dir` after each stage."""
    done = read_record(root, stages) if resume else {}
    reopen_lengthened(stages, done)
    previous_final: Path | None = None
    for stage in stages:
        if stage.name in done:
            previous_final = Path(done[stage.name]["final_checkpoint"])
            log.info(f"stage {stage.index + 1}/{len(stages)} ({stage.name}) already finished: {previous_final}")
            continue
        cfg = stage.cfg
        # Read in full before any rank loads it, as a resume's checkpoint is; there is no older one
        # to fall back to here (trainer/checkpoint.py).
        if previous_final is not None and (problem := damage(previous_final)):
            where = f"stage {stage.index + 1}/{len(stages)} ({stage.name})"
            raise ConfigError(f"{previous_final}, where {where} starts, is damaged ({problem}): restore it from a "
                              "copy, or start over with trainer.resume_mode=disable")
        r = cfg[ARR].rollout
        print(f"logicrl: stage {stage.index + 1}/{len(stages)} ({stage.name}): train_batch_size="
              f"{stage.plan.prompts}, rollout.n={stage.plan.n}, temperature={r.temperature}, "
              f"lr={cfg[ARR].actor.optim.lr}" + (f", from {previous_final}" if previous_final else ""))
        trainer = PPOTrainer(cfg, stage.plan, run_dir / stage.dir_name, init_from=previous_final,
                             carry_optimizer=carry_optimizer, stage=stage.index, faults=faults)
        trainer.fit()
        final = complete_checkpoints(cfg.trainer.default_local_dir)[-1][1]
        done[stage.name] = stage_row(stage, trainer.history, trainer.elapsed_s, final)
        write_record(root, stages, done)
        previous_final = final
        write_summaries(stages, done, run_dir)
    return done
