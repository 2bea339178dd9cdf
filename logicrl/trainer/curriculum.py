"""Runs a curriculum's stages in order, each from the last one's final weights, resumably.

The record of finished stages is `<trainer.default_local_dir>/curriculum.json`, written atomically
after a stage's final checkpoint is committed. Re-running the same command skips the stages it
lists, and the first unfinished stage resumes from its own newest complete checkpoint (or starts
from the previous stage's final one): after a crash at any point the curriculum continues at the
right stage and step. `trainer.resume_mode=disable` is for a directory that holds no run (the
preflight refuses it over one); every way out below starts over in another directory or moves this aside.

Each finished stage's row keeps its resolved config, so a re-run whose stage now says something
else (an edited recipe, another command-line value) is refused, naming the keys, rather than the
change being silently ignored; keys that steer how a run runs, not what it trains, are not compared.
"""

from __future__ import annotations

import json
import logging
from fnmatch import fnmatch
from pathlib import Path

from logicrl.checkpoint_layout import start_over_hint
from logicrl.config.errors import ConfigError
from logicrl.config.flat import flat_config
from logicrl.config.plan import ARR
from logicrl.config.stages import Stage
from logicrl.faults import Faults
from logicrl.trainer.checkpoint import newest_resumable, verified, write_durably
from logicrl.trainer.summaries import stage_row, write_summaries

log = logging.getLogger("logicrl.trainer")
RECORD_FILE = "curriculum.json"
RECORD_FORMAT = 1
# Keys a finished stage is not compared on: where and how fast it runs (devices, micro-batches,
# offload, engine memory), logging, checkpoints and validation. A re-run on another allocation or
# with other logging is the same curriculum. Its length is compared by steps (finished_changes).
NOT_TRAINING = ("trainer.*", "curriculum.*", "eval.*", "data.val_*", "actor_rollout_ref.rollout.val_kwargs.*",
                "*micro_batch_size*", "*max_token_len_per_gpu", "*use_dynamic_bsz", "*fsdp_config.*",
                "*.enable_gradient_checkpointing", "*.use_remove_padding", "reward_model.forward_max_token_len_per_gpu",
                *(f"actor_rollout_ref.rollout.{k}" for k in (
                    "name", "gpu_memory_utilization", "kv_cache_gb", "max_num_seqs", "max_num_batched_tokens",
                    "enforce_eager", "free_cache_engine", "enable_prefix_caching", "update_weights_bucket_mb",
                    "lora_sync", "tensor_model_parallel_size")))
TRAINING_TRAINER_KEYS = ("trainer.seed", "trainer.critic_warmup")
SHOWN_CHANGES = 4  # the line lists this many changed keys, then a count


def read_record(root: Path, stages: list[Stage]) -> dict:
    """{stage name: its row} of the stages already finished under `root`."""
    path = root / RECORD_FILE
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    names = [s.name for s in stages]
    if data.get("format") != RECORD_FORMAT or data.get("stages") != names:
        raise ConfigError(f"{path} records a curriculum with stages {data.get('stages')}, this one has {names}: "
                          f"{start_over_hint(root)}")
    return data["done"]


def write_record(root: Path, stages: list[Stage], done: dict) -> None:
    root.mkdir(parents=True, exist_ok=True)
    payload = {"format": RECORD_FORMAT, "stages": [s.name for s in stages], "done": done}
    write_durably(root / RECORD_FILE, json.dumps(payload, indent=1))


def finished_row(stage: Stage, history: list[dict], elapsed_s: float, final: Path) -> dict:
    """A finished stage's row in the record: its summary, and its config to compare re-runs with."""
    return {**stage_row(stage, history, elapsed_s, final), "config": flat_config(stage.cfg)}


def compared(key: str) -> bool:
    return key in TRAINING_TRAINER_KEYS or not any(fnmatch(key, pattern) for pattern in NOT_TRAINING)


def finished_changes(stage: Stage, row: dict) -> list[str]:
    """What `stage` now sets differently from what it finished with: `key old -> new` each. A row
    written before configs were recorded has none to compare (nothing is said)."""
    recorded = row.get("config")
    if recorded is None:
        return []
    now = flat_config(stage.cfg)
    changes = [f"{key} {show(recorded[key])} -> {show(now[key])}" for key in sorted(recorded.keys() & now.keys())
               if compared(key) and recorded[key] != now[key]]
    if finished_step(row) > stage.plan.total_steps:
        changes.append(f"steps {finished_step(row)} -> {stage.plan.total_steps}")
    return changes


def show(value) -> str:
    return value if isinstance(value, str) else json.dumps(value)


def refuse_edited(stages: list[Stage], done: dict) -> None:
    """A finished stage is not trained again, so a change to it would be ignored: say so instead."""
    for stage in stages:
        row = done.get(stage.name)
        changes = finished_changes(stage, row) if row is not None else []
        if not changes:
            continue
        more = f" and {len(changes) - SHOWN_CHANGES} more" if len(changes) > SHOWN_CHANGES else ""
        raise ConfigError(
            f"curriculum stage {stage.index + 1}/{len(stages)} ({stage.name}) already finished with other settings "
            f"than it has now: {', '.join(changes[:SHOWN_CHANGES])}{more}; a finished stage is not trained again, "
            "so the change would be ignored: undo it (to change only the stages still to run, set it in their "
            f"overrides: +curriculum.stages.<index>.overrides.<key>=<value>); or, {start_over_hint(_root(stages))}")


def _root(stages: list[Stage]) -> Path:
    """The curriculum's directory: each stage's trainer.default_local_dir is <root>/<NN_name>."""
    return Path(stages[0].cfg.trainer.default_local_dir).parent


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
                              f"only the last finished stage; or, {start_over_hint(_root(stages))}")
        log.info(f"stage {stage.index + 1}/{len(stages)} ({stage.name}) finished at step {finished_step(row)} and now "
                 f"has {stage.plan.total_steps}: continuing it")
        del done[stage.name]


def finished_stages(stages: list[Stage], root: Path, resume: bool) -> dict:
    """{stage name: its row} of the finished stages this launch skips, from the record under `root`; raises
    ConfigError for a finished stage lengthened under a later one, or edited, before any stage starts."""
    done = read_record(root, stages) if resume else {}
    reopen_lengthened(stages, done)
    refuse_edited(stages, done)
    return done


def run_curriculum(stages: list[Stage], root: Path, run_dir: Path, carry_optimizer: bool, resume: bool,
                   faults: Faults | None = None, done: dict | None = None) -> dict:
    """Train every stage; returns {stage name: summary row}. Summaries go to `run_dir` after each stage.
    `done`: finished_stages' answer, when the caller read the record already (main_ppo does, before Ray)."""
    from logicrl.trainer.one_step_off import trainer_class  # torch: main_ppo reads the record (this module) first

    done = finished_stages(stages, root, resume) if done is None else done
    previous_final: Path | None = None
    from_earlier_run = False  # previous_final was written by an earlier launch, not just now by this one
    for stage in stages:
        if stage.name in done:
            previous_final, from_earlier_run = Path(done[stage.name]["final_checkpoint"]), True
            log.info(f"stage {stage.index + 1}/{len(stages)} ({stage.name}) already finished: {previous_final}")
            continue
        cfg = stage.cfg
        # One an earlier launch wrote is read in full before any rank loads it, as a resume's checkpoint
        # is; there is no older one to fall back to here (trainer/checkpoint.py). One this launch just
        # committed was summed as it was written: reading it back (~100 GB at 7B) would find nothing new.
        if from_earlier_run and (problem := verified(previous_final)):
            where = f"stage {stage.index + 1}/{len(stages)} ({stage.name})"
            raise ConfigError(f"{previous_final}, where {where} starts, is damaged ({problem}): restore it from a "
                              f"copy; or, {start_over_hint(root)}")
        r = cfg[ARR].rollout
        print(f"logicrl: stage {stage.index + 1}/{len(stages)} ({stage.name}): train_batch_size="
              f"{stage.plan.prompts}, rollout.n={stage.plan.n}, temperature={r.temperature}, "
              f"lr={cfg[ARR].actor.optim.lr}" + (f", from {previous_final}" if previous_final else ""))
        trainer = trainer_class(cfg)(cfg, stage.plan, run_dir / stage.dir_name, init_from=previous_final,
                             carry_optimizer=carry_optimizer, stage=stage.index, faults=faults)
        trainer.fit()
        final = newest_resumable(cfg.trainer.default_local_dir)
        done[stage.name] = finished_row(stage, trainer.history, trainer.elapsed_s, final)
        write_record(root, stages, done)
        previous_final, from_earlier_run = final, False
        write_summaries(stages, done, run_dir)
    return done
