"""A curriculum's stages as complete configs: base + the stage's overlay + the command line.

    curriculum:
      stages:
        - name: 3ppl
          overrides: {data: {train_files: data/kk/instruct/3ppl/train.parquet}, trainer: {total_training_steps: 40}}
        - name: 4ppl
          overrides: {data: {train_files: ...}, actor_rollout_ref: {rollout: {n: 16}}}

Hydra has already merged base, recipe and command line into one config; a stage's overlay goes on
top of that, and then the command-line overrides are applied again, so that what the user typed
wins over every stage (`data.train_batch_size=4` applies to all of them). Every stage is validated
before the first one starts: a typo in stage 5 stops the run before stage 1 loads a model.

Each stage gets its own checkpoint directory, `<trainer.default_local_dir>/<NN>_<name>/`; the
curriculum's own record (trainer/curriculum.py) lives in `<trainer.default_local_dir>/`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from hydra.core.override_parser.overrides_parser import OverridesParser
from omegaconf import DictConfig, ListConfig, OmegaConf

from logicrl.config.errors import ConfigError
from logicrl.config.plan import StepPlan
from logicrl.config.schema import RootConfig
from logicrl.config.validate import validate
from logicrl.models.spec import ModelSpec

_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*")
GROUPS = {f for f in RootConfig.__dataclass_fields__}
# Selecting a config group (`+recipe=x`, `preset=verl`, `data=default`) shaped the base; it is not a value to re-apply.
GROUP_SELECTIONS = {"recipe", "preset", *GROUPS}


@dataclass
class Stage:
    index: int  # 0-based
    name: str
    cfg: DictConfig  # typed, validated
    spec: ModelSpec
    plan: StepPlan

    @property
    def dir_name(self) -> str:
        return f"{self.index + 1:02d}_{self.name}"


def has_stages(cfg: DictConfig) -> bool:
    stages = OmegaConf.select(cfg, "curriculum.stages")
    return bool(stages)


def _stage_entries(cfg: DictConfig) -> list[tuple[str, DictConfig]]:
    stages = cfg.curriculum.stages
    if not isinstance(stages, ListConfig):
        raise ConfigError("curriculum.stages must be a list of {name, overrides} entries")
    entries, seen = [], set()
    for i, entry in enumerate(stages):
        where = f"curriculum.stages[{i}]"
        if not isinstance(entry, DictConfig) or "name" not in entry:
            raise ConfigError(f"{where} must be a mapping with a `name` (and `overrides`), got {entry!r}")
        extra = set(entry) - {"name", "overrides"}
        if extra:
            raise ConfigError(f"{where} has unknown field(s) {sorted(extra)}: a stage has only `name` and "
                              "`overrides` (put config keys under overrides)")
        name = str(entry.name)
        if not _NAME.fullmatch(name):
            raise ConfigError(f"{where}.name={name!r} must be letters, digits, '_', '.' or '-' (it names a directory)")
        if name in seen:
            raise ConfigError(f"{where}.name={name!r} is used twice: stage names must be unique")
        seen.add(name)
        overlay = entry.get("overrides") or OmegaConf.create({})
        if not isinstance(overlay, DictConfig):
            raise ConfigError(f"{where}.overrides must be a mapping of config groups, "
                              "e.g. {data: {train_files: ...}}")
        for top in overlay:
            if top in ("curriculum", "hydra"):
                raise ConfigError(f"{where}.overrides.{top}: a stage cannot change {top}")
        entries.append((name, overlay))
    return entries


def _reapply(cfg: DictConfig, overrides: list[str]) -> None:
    """Apply the command line's key=value overrides to `cfg` again (group selections excepted)."""
    for o in OverridesParser.create().parse_overrides(overrides):
        key = o.key_or_group
        if key in GROUP_SELECTIONS or key == "hydra" or key.startswith(("hydra.", "curriculum")):
            continue
        if o.is_delete():
            parent, _, leaf = key.rpartition(".")
            node = OmegaConf.select(cfg, parent) if parent else cfg
            if isinstance(node, DictConfig) and leaf in node:
                del node[leaf]
            continue
        OmegaConf.update(cfg, key, o.value(), merge=False, force_add=True)


def build_stages(cfg: DictConfig, cli_overrides: list[str]) -> list[Stage]:
    """Every stage's config, validated; raises ConfigError naming the stage on the first bad one."""
    if cfg.trainer.resume_mode not in ("auto", "disable"):
        raise ConfigError(f"trainer.resume_mode={cfg.trainer.resume_mode}: a curriculum resumes by itself "
                          "(each stage from its own checkpoints); use auto or disable")
    root = str(cfg.trainer.default_local_dir)  # resolved with the command line, before any stage
    base = OmegaConf.to_container(cfg, resolve=False)
    base["curriculum"]["stages"] = []
    stages = []
    for index, (name, overlay) in enumerate(_stage_entries(cfg)):
        merged = OmegaConf.merge(OmegaConf.create(base), overlay)
        _reapply(merged, cli_overrides)
        if OmegaConf.select(overlay, "trainer.experiment_name") is None:
            merged.trainer.experiment_name = f"{cfg.trainer.experiment_name}-{name}"
        stage = Stage(index, name, merged, None, None)  # type: ignore[arg-type]
        merged.trainer.default_local_dir = f"{root}/{stage.dir_name}"
        try:
            stage.cfg, stage.spec, stage.plan = validate(merged)
        except ConfigError as e:
            raise ConfigError(f"curriculum stage {index + 1} ({name}): {e}") from None
        stages.append(stage)
    return stages
