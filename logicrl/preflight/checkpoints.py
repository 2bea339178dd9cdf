"""Does the checkpoint this run would resume from fit it? Said before Ray starts, not by DCP after.

    write_run_shape(tmp_dir, cfg)   # the trainer, into every checkpoint: shape.json and config.json
    check_checkpoint(cfg)           # the preflight: raises ConfigError naming the difference and the choices
    check_not_done(cfg, plan)       # a finished run there that this launch differs from: refused
    check_fresh_start(cfg, root)    # resume_mode=disable where checkpoints are: refused, never overwritten

shape.json records what decides whether a checkpoint can load into a run: the shape of each trained
model (from its config.json), the LoRA rank, alpha and target modules, and which roles hold sharded
state (actor, critic: the reference and the reward model are frozen and load from their paths).
Without it a LoRA rank-8 checkpoint resumed at rank 16 ends after Ray starts with DCP's
`CheckpointException ranks:dict_keys([0])`, and a GRPO one resumed with gae with a missing
critic/meta.json. A checkpoint saved before this record existed is compared on its roles only (a
critic/ directory or none); the rest is skipped. The comparison is against the checkpoint resume_mode
picks: the one `latest` names (auto) or the one it names; its integrity is the trainer's check. Every
way out offered starts a new run in a directory of its own or moves the old one aside: nothing of two
runs mixes in one directory.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from logicrl.checkpoint_layout import (
    CONFIG_FILE,
    SHAPE_FILE,
    STATE_FILE,
    complete_checkpoints,
    holds_checkpoints,
    newest_resumable,
    start_over_hint,
)
from logicrl.checkpoint_pickles import refuse_code
from logicrl.config.errors import ConfigError
from logicrl.config.flat import LAUNCH_ONLY, differences, flat_config, show
from logicrl.config.models import MODELS, in_use
from logicrl.config.plan import ARR, StepPlan
from logicrl.models.spec import ModelSpecError, load_model_spec

log = logging.getLogger("logicrl.preflight")
SHAPE_FORMAT = 1
SHOWN = 4  # a refusal lists this many changed keys, then a count
# What of a model's config.json fixes its parameters' shapes (models/spec.py's names).
SHAPE_FIELDS = ("model_type", "num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim",
                "intermediate_size", "vocab_size", "tie_word_embeddings", "attention_bias")
# quantization: adapters trained over an NF4 base fit only that base (docs/quantization.md); a checkpoint
# from before the key holds None, as an unquantized run does.
LORA_KEYS = ("lora_rank", "lora_alpha", "target_modules", "quantization")


def _model_shape(path: str) -> dict:
    spec = load_model_spec(path)
    return {name: getattr(spec, name) for name in SHAPE_FIELDS}


def _targets(value):
    value = OmegaConf.to_container(value) if OmegaConf.is_config(value) else value
    return sorted(value) if isinstance(value, list) else value


def run_shape(cfg: DictConfig) -> dict:
    """What a checkpoint of this run holds and what it can be loaded into (shape.json's content)."""
    model = cfg[ARR].model
    roles = [m for m in MODELS if m.trains and m.in_use(cfg)]  # the models a checkpoint holds
    models = {m.path_key: {"path": str(m.get(cfg, "path_key")), "shape": _model_shape(m.get(cfg, "path_key"))}
              for m in roles}
    lora = {f"{ARR}.model.{key}": _targets(model[key]) for key in LORA_KEYS}
    return {"format": SHAPE_FORMAT, "roles": [m.name for m in roles],
            "algorithm.adv_estimator": str(cfg.algorithm.adv_estimator),
            "models": models, "lora": lora}


def write_run_shape(directory: str | Path, cfg: DictConfig) -> None:
    """shape.json and config.json into a checkpoint being saved (a few KB; the manifest sums them)."""
    (Path(directory) / SHAPE_FILE).write_text(json.dumps(run_shape(cfg), indent=1))
    (Path(directory) / CONFIG_FILE).write_text(json.dumps(flat_config(cfg), indent=0))


def saved_config(checkpoint: Path) -> dict | None:
    """The flat config a checkpoint's run had (config.json), or None: saved before it was recorded, or unreadable."""
    try:
        data = json.loads((checkpoint / CONFIG_FILE).read_text())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def new_directory_key(cfg: DictConfig) -> str:
    """The setting that gives a run a directory of its own: the experiment's name where the default
    trainer.default_local_dir is built from it, else the directory itself."""
    t = cfg.trainer
    if str(t.default_local_dir) == f"checkpoints/{t.project_name}/{t.experiment_name}":
        return "trainer.experiment_name=<new name>"
    return "trainer.default_local_dir=<another directory>"


def way_out(cfg: DictConfig, root: str | Path | None = None) -> str:
    """How to start a new run where `root` (this run's checkpoint directory) holds another."""
    return start_over_hint(root if root is not None else cfg.trainer.default_local_dir, new_directory_key(cfg))


def check_fresh_start(cfg: DictConfig, root: str | Path) -> None:
    """trainer.resume_mode=disable where `root` (a curriculum's: its stage directories too) holds
    checkpoints: refused. Starting over there would save global_step_1.. over the old run's, and a later
    plain launch would resume a mix of the two; a run that saves nothing (val_only) is let through."""
    t = cfg.trainer
    if str(t.resume_mode) != "disable" or t.val_only or not holds_checkpoints(root):
        return
    newest = newest_resumable(root)
    what = f"up to {newest.name}" if newest is not None else "in its stage directories"
    raise ConfigError(f"trainer.resume_mode=disable, but trainer.default_local_dir={root} holds another run's "
                      f"checkpoints ({what}), which starting over there would overwrite and mix with this run's: "
                      f"{way_out(cfg, root)}; or drop trainer.resume_mode=disable to resume it")


def check_not_done(cfg: DictConfig, plan: StepPlan) -> None:
    """The checkpoint this launch would resume finished its run (its step is this plan's last or past it)
    and its config differs from this launch's: refused, since nothing would train; the line names the run
    there, what differs, and how to start a new one. The same config (or one differing only in how it is
    watched: LAUNCH_ONLY) goes on to the trainer's "nothing to train", as a re-run of a finished job should."""
    path = resume_candidate(cfg) if str(cfg.trainer.resume_mode) == "auto" else None
    if path is None:
        return
    try:
        step = int(json.loads((path / STATE_FILE).read_text())["step"])
    except (OSError, ValueError, KeyError, TypeError):
        return  # unreadable: the trainer's verification sets it aside or refuses it
    saved = saved_config(path)
    if step < plan.total_steps or saved is None:
        return
    changed = differences(saved, flat_config(cfg), LAUNCH_ONLY)
    if not changed:
        return
    shown = ", ".join(f"{key} {show(old)} -> {show(new)}" for key, old, new in changed[:SHOWN])
    more = f" and {len(changed) - SHOWN} more" if len(changed) > SHOWN else ""
    root = cfg.trainer.default_local_dir
    raise ConfigError(f"trainer.default_local_dir={root} holds a finished run ({path.name}: step {step} of "
                      f"{plan.total_steps}), and this launch differs from it ({shown}{more}): resuming it would "
                      f"train nothing; {way_out(cfg)}")


def resume_candidate(cfg: DictConfig) -> Path | None:
    """The checkpoint trainer.resume_mode would pick, by name only (the trainer verifies its content)."""
    mode = str(cfg.trainer.resume_mode)
    if mode == "disable":
        return None
    if mode != "auto":
        path = Path(mode)
        return path if path.is_dir() else None  # a missing one is the trainer's one line
    return newest_resumable(cfg.trainer.default_local_dir)


def check_checkpoint(cfg: DictConfig) -> None:
    """Raises ConfigError when the checkpoint this run would resume from cannot load into it."""
    path = resume_candidate(cfg)
    if path is None:
        return
    refuse_code(path)  # before anything reads it: no rank ever unpickles what this refuses
    mode = str(cfg.trainer.resume_mode)
    where = (f"trainer.default_local_dir={cfg.trainer.default_local_dir}: {path.name}" if mode == "auto"
             else f"trainer.resume_mode={mode}")
    # resume_mode=<path> saves into trainer.default_local_dir, not beside the path: nothing to move aside.
    elsewhere = way_out(cfg) if mode == "auto" else "name another checkpoint in trainer.resume_mode"
    check_state_file(cfg, path)
    try:
        saved = json.loads((path / SHAPE_FILE).read_text())
    except FileNotFoundError:
        saved = None  # saved before shape.json existed: the roles on disk are all there is to compare
    except (OSError, json.JSONDecodeError):
        log.warning(f"{path / SHAPE_FILE} is unreadable: not comparing that checkpoint with this run")
        return
    if (problem := _difference(cfg, path, saved)) is not None:
        difference, old = problem
        resume = f"resume it with {old}; or, " if old else ""
        raise ConfigError(f"{where} {difference}: {resume}{elsewhere}")


def _state_problem(path: Path) -> str | None:
    try:
        json.loads((path / STATE_FILE).read_text())
    except FileNotFoundError:
        return None  # the trainer's verification names a missing file with the rest of the checkpoint's
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as err:
        return " ".join(f"{type(err).__name__}: {err}".split())
    return None


def check_state_file(cfg: DictConfig, path: Path) -> None:
    """The checkpoint's trainer_state.json must parse: one damaged after it was saved (its manifest's CRC
    updated along with it, so the checksums agree) would otherwise end the launch in a JSONDecodeError."""
    problem = _state_problem(path)
    if problem is None:
        return
    others = [p for _, p in complete_checkpoints(path.parent) if p != path and _state_problem(p) is None]
    keep = (f"{others[-1]} is the newest other checkpoint whose state reads: move {path} aside to resume from it"
            if others else "no other checkpoint there reads")
    raise ConfigError(f"{path / STATE_FILE} does not read ({problem[:160]}), though {path.name} is marked complete: it "
                      f"was damaged or edited after it was saved; {keep}; or, {way_out(cfg)}")


def _difference(cfg: DictConfig, path: Path, saved: dict | None) -> tuple[str, str | None] | None:
    """(what differs, the setting that would resume it or None), or None when the checkpoint fits."""
    estimator = cfg.algorithm.adv_estimator
    if in_use(cfg)["critic"] and not (path / "critic").is_dir():
        old = saved.get("algorithm.adv_estimator") if saved else None
        how = f"it was saved with algorithm.adv_estimator={old}" if old else "it was saved by a run without one"
        return (f"holds no critic ({how}) and this run's algorithm.adv_estimator={estimator} trains one",
                f"algorithm.adv_estimator={old}" if old else None)
    if saved is None or saved.get("format") != SHAPE_FORMAT:
        return None
    try:
        current = run_shape(cfg)
    except ModelSpecError:
        return None  # a model directory the model checks refuse, in their own words
    lora_was, lora_is = saved["lora"].get(f"{ARR}.model.lora_rank", 0), current["lora"][f"{ARR}.model.lora_rank"]
    for key in (f"{ARR}.model.{name}" for name in LORA_KEYS):
        if key != f"{ARR}.model.lora_rank" and not (lora_was and lora_is):
            continue  # alpha, targets and the base's quantization mean nothing without LoRA
        old, new = saved["lora"].get(key), current["lora"][key]
        if old != new:
            return f"was saved with {key}={_show(old)}, this run has {_show(new)}", f"{key}={_show(old)}"
    for key, model in current["models"].items():
        was = saved["models"].get(key)
        if was is None:
            continue  # a critic in the checkpoint that this run does not train is left unread
        changed = [name for name in SHAPE_FIELDS if was["shape"].get(name) != model["shape"][name]]
        if changed:
            old = ", ".join(f"{name}={was['shape'].get(name)}" for name in changed)
            new = ", ".join(f"{name}={model['shape'][name]}" for name in changed)
            return (f"was saved from a model with {old} ({key}={was['path']}), and {key}={model['path']} has {new}",
                    f"{key}={was['path']}")
        if lora_is and was["path"] != model["path"] and key == f"{ARR}.model.path":
            # Same shapes: it loads, but the adapter will sit on another base model's weights.
            log.warning(f"{path} holds a LoRA adapter trained on {key}={was['path']}; this run's base is "
                        f"{model['path']} (same shapes): resuming on it")
    return None


def _show(value) -> str:
    """As the user would type it on the command line: [q_proj,v_proj], 16 (not 16.0), null."""
    if value is None:
        return "null"
    if isinstance(value, list):
        return "[" + ",".join(map(str, value)) + "]"
    return f"{value:g}" if isinstance(value, float) else str(value)
