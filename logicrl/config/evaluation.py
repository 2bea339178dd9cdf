"""The checkpoints eval.checkpoints names, as runs to plan (the group's checks: config/eval_keys.py).

    runs = eval_runs(cfg)                   # one validated Stage per eval.checkpoints entry (or the model)

A checkpoint is read from the filesystem only (no model loads here): an HF model directory (config.json),
a LoRA adapter (adapter_config.json, over the base it names), a run's global_step_N (its huggingface/
export when saved, else its sharded state over the model shape.json records), or a directory holding
global_step_N (a run's checkpoint root, a curriculum stage's directory: its newest complete step). Each
becomes a Stage whose config points at the model to load, so the preflight plans every one before any starts.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig, OmegaConf, open_dict

from logicrl.checkpoint_layout import SHAPE_FILE, complete_checkpoints, is_complete, step_of
from logicrl.config.errors import ConfigError
from logicrl.config.plan import ARR
from logicrl.config.stages import Stage
from logicrl.config.validate import validate

HF_EXPORT, LORA_EXPORT = "huggingface", "lora_adapter"  # a checkpoint's export (workers/hf_export.py)


@dataclass(frozen=True)
class EvalTarget:
    """One checkpoint to evaluate: the config values that load it, and what the trainer does on top."""

    label: str  # its name in the table: the directory's name, its run's with a global_step_N
    path: Path  # as given
    overrides: dict  # config key -> value (the model path; a sharded checkpoint's LoRA shape)
    init_from: Path | None = None  # a global_step_N whose trained state replaces the model's weights
    adapter: Path | None = None  # a LoRA adapter merged over the model before it loads


def _newest(root: Path, key: str) -> Path:
    found = complete_checkpoints(root)
    if not found:
        stages = sorted(p.name for p in root.iterdir() if p.is_dir() and complete_checkpoints(p))
        hint = f"; its stages {stages} do: name one" if stages else ""
        raise ConfigError(f"{key}={root} is no model directory (config.json), LoRA adapter (adapter_config.json) "
                          f"or checkpoint, and holds no complete global_step_N{hint}")
    return found[-1][1]


def _adapter_target(label: str, path: Path, adapter: Path, key: str) -> EvalTarget:
    base = json.loads((adapter / "adapter_config.json").read_text()).get("base_model_name_or_path")
    if not base or not Path(base).is_dir():
        raise ConfigError(f"{key}={path}: the LoRA adapter's base_model_name_or_path={base!r} is not a local "
                          "directory; edit adapter_config.json to point at the base model's directory")
    return EvalTarget(label, path, {f"{ARR}.model.path": base}, adapter=adapter)


def _step_target(label: str, path: Path, step: Path, key: str) -> EvalTarget:
    if not is_complete(step):
        raise ConfigError(f"{key}={path}: {step.name} is incomplete (no COMPLETE file): a save was cut short; "
                          "name an earlier global_step_N")
    export = step / HF_EXPORT
    if (export / "config.json").is_file():
        return EvalTarget(label, path, {f"{ARR}.model.path": str(export)})
    if (export / LORA_EXPORT / "adapter_config.json").is_file():
        return _adapter_target(label, path, export / LORA_EXPORT, key)
    shape_file = step / SHAPE_FILE
    if not shape_file.is_file():
        raise ConfigError(f"{key}={path}: {step.name} has no {HF_EXPORT}/ export and no {SHAPE_FILE} saying which "
                          "model it trained; save with trainer.save_hf_model=true, or name the model directory")
    shape = json.loads(shape_file.read_text())
    overrides = {f"{ARR}.model.path": shape["models"][f"{ARR}.model.path"]["path"], **shape.get("lora", {})}
    return EvalTarget(label, path, overrides, init_from=step)


def resolve(path: str | Path, key: str) -> EvalTarget:
    """What `path` is and how to load it (module docstring); `key` names it in errors."""
    path = Path(path).expanduser()
    if not path.is_dir():
        raise ConfigError(f"{key}={path} does not exist (or is not a directory)")
    if (path / "adapter_config.json").is_file():
        return _adapter_target(path.name, path, path, key)
    if (path / "config.json").is_file():
        return EvalTarget(path.name, path, {f"{ARR}.model.path": str(path)})
    step = path if step_of(path) is not None else _newest(path, key)
    return _step_target(f"{step.parent.name}/{step.name}", path, step, key)


def eval_targets(cfg: DictConfig) -> list[EvalTarget]:
    """eval.checkpoints resolved; without any, model.path as it is. Labels made unique by their paths."""
    targets = [resolve(p, f"eval.checkpoints[{i}]") for i, p in enumerate(cfg.eval.checkpoints)]
    if not targets:
        path = Path(str(cfg[ARR].model.path))
        targets = [EvalTarget(path.name or str(path), path, {})]
    labels = [t.label for t in targets]
    if len(set(labels)) < len(labels):
        targets = [EvalTarget(str(t.path), t.path, t.overrides, t.init_from, t.adapter) for t in targets]
    return targets


def eval_runs(cfg: DictConfig) -> tuple[list[Stage], list[EvalTarget]]:
    """The composed config validated as it is (eval.* included), then one validated Stage per target with
    the target's model; without eval.checkpoints the one Stage of model.path."""
    typed, spec, plan = validate(cfg)
    targets = eval_targets(typed)
    if not cfg.eval.checkpoints:
        return [Stage(0, targets[0].label, typed, spec, plan)], targets
    stages = []
    for i, target in enumerate(targets):
        one = cfg.copy()
        with open_dict(one):
            for key, value in target.overrides.items():
                OmegaConf.update(one, key, value, merge=False)
            one.eval.checkpoints = []
        stages.append(Stage(i, target.label, *validate(one)))
    return stages, targets
