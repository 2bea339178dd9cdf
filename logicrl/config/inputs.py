"""The preflight's checks of what a run reads: model directories, data files and rows, rewards.

    tokenizer = check_models(cfg, dry_run)   # None in a dry run: it imports no transformers
    check_data(cfg, tokenizer)

A dry run checks what needs no transformers import (weight files, every data file read, a
sample of rows, their data_source and ground_truth); the real run also loads the tokenizer,
checks it against the model and the chat template, and renders and tokenizes the sampled
prompts (truncation included). Up to SAMPLE_ROWS rows of each file are checked here, in a second
or two however large the file; the trainer's full load checks the rest with the same code, and
a problem it finds there is the same one-line error (main_ppo catches BadInput anywhere).
"""

from __future__ import annotations

import functools
import logging
from pathlib import Path

from omegaconf import DictConfig, OmegaConf

from logicrl.config.errors import ConfigError
from logicrl.config.plan import ARR, uses_critic
from logicrl.data.dataset import DatasetError, check_rows, load_prompts
from logicrl.data.files import as_paths, dataset_rows
from logicrl.models.spec import load_model_spec
from logicrl.models.tiny import EMBEDDED_CONFIGS
from logicrl.reward import REWARD_FNS, ground_truth_problem
from logicrl.reward.combine import CombineRule

log = logging.getLogger("logicrl.config")
SAMPLE_ROWS = 2_000  # per file; rendering and tokenizing that many prompts takes about a second


def combine_rule(cfg: DictConfig) -> CombineRule | None:
    """reward.combine as a rule (validated by config/validate.py), or None without a reward model:
    then the rules alone score."""
    if not cfg.reward_model.enable:
        return None
    c = cfg.reward.combine
    return CombineRule.from_config(c.mode, _plain(c.weights), _plain(c.by_data_source) or None)


def _plain(value):
    return OmegaConf.to_container(value) if OmegaConf.is_config(value) else value


def reward_check(cfg: DictConfig):
    """The row check for the rewards this run uses: a custom reward takes every data_source and
    its ground truth is its own business (calling it here could be slow or have side effects).
    A data_source with no rule reward passes only where reward.combine scores it by the reward
    model alone; elsewhere its row is refused with the ways to score it."""
    if cfg.reward.custom.path:
        return None
    rule = combine_rule(cfg)
    by_source = _plain(cfg.reward.combine.by_data_source) or {}

    def check(data_source: str, ground_truth) -> str | None:
        if data_source in REWARD_FNS:
            return ground_truth_problem(data_source, ground_truth)
        if rule is not None and not rule.needs_rule(data_source):
            return None  # the reward model's score alone; no rule to read the ground truth
        override = f"reward.combine.by_data_source.{data_source}=model"
        if rule is None:
            return (f"no rule reward for data_source={data_source!r} (known: {sorted(REWARD_FNS)}): score it by a "
                    f"reward model alone (reward_model.enable=true, reward_model.model.path, {override}), register "
                    f"a rule with @logicrl.reward.register({data_source!r}), or set reward.custom.path/name")
        entry = by_source.get(data_source)
        key = (f"reward.combine.mode={cfg.reward.combine.mode}" if entry is None else
               f"reward.combine.by_data_source.{data_source}" + (f"={entry}" if isinstance(entry, str) else ""))
        return (f"no rule reward for data_source={data_source!r} (known: {sorted(REWARD_FNS)}), but {key} weighs "
                f"one in (rule weight {rule.weights(data_source).rule:g}): set {override} to score it by the reward "
                f"model alone, or register a rule with @logicrl.reward.register({data_source!r})")

    return check


def model_paths(cfg: DictConfig) -> list[tuple[str, str]]:
    paths = [(f"{ARR}.model.path", cfg[ARR].model.path)]
    if uses_critic(cfg) and cfg.critic.model.path != cfg[ARR].model.path:
        paths.append(("critic.model.path", cfg.critic.model.path))
    rm = cfg.reward_model
    # Its tokenizer is read only to re-render rows (reward_model.model.input_tokenizer set): then it must load.
    if rm.enable and rm.model.input_tokenizer and rm.model.path != cfg[ARR].model.path:
        paths.append(("reward_model.model.path", rm.model.path))
    return paths


def check_models(cfg: DictConfig, dry_run: bool):
    """Each model directory's weights; outside a dry run also its model_type and tokenizer.
    Returns the actor's tokenizer (None in a dry run); raises ConfigError."""
    from logicrl.models.checks import weights_problem

    tokenizer = None
    for key, path in model_paths(cfg):
        if path not in EMBEDDED_CONFIGS and (problem := weights_problem(Path(path))):
            if not dry_run:
                raise ConfigError(f"{key}: {problem}")
            # A dry run may plan from a config-only directory (logicrl/memory/shapes/): say it, go on.
            log.warning(f"{key}: {problem} (a dry run plans without them; training needs them)")
        if not dry_run:
            loaded = _checked_tokenizer(key, path)
            tokenizer = tokenizer or loaded
    return tokenizer


@functools.lru_cache(maxsize=4)  # a curriculum's stages share their model
def _checked_tokenizer(key: str, path: str):
    from logicrl.models.checks import model_type_problem, tokenizer_problem
    from logicrl.models.loading import checkpoint_dir, load_tokenizer

    spec = load_model_spec(path)
    if problem := model_type_problem(spec):
        raise ConfigError(f"{key}: {problem}")
    try:
        tokenizer = load_tokenizer(path)
    except Exception as err:  # noqa: BLE001 - transformers raises many kinds for a broken tokenizer
        raise ConfigError(f"{key}={path}: the tokenizer does not load ({type(err).__name__}: "
                          f"{' '.join(str(err).split())[:200]}): copy the checkpoint's tokenizer files") from None
    if problem := tokenizer_problem(tokenizer, checkpoint_dir(path), spec):
        raise ConfigError(f"{key}: {problem}")
    if not getattr(tokenizer, "chat_template", None):
        log.info(f"{key}={path}: the tokenizer has no chat template: chat-list prompts become 'Role: content' lines "
                 "(logicrl/data/prompts.py)")
    return tokenizer


def check_data(cfg: DictConfig, tokenizer) -> None:
    """data.train_files and data.val_files: readable, SAMPLE_ROWS rows of each file well formed and
    scorable (and, with a tokenizer, rendered, tokenized and within data.truncation's rules)."""
    data = cfg.data
    for key in ("train_files", "val_files"):
        files = as_paths(data[key])
        total = dataset_rows(files)
        try:
            if tokenizer is None:
                checked = check_rows(files, prompt_key=data.prompt_key, skip_bad_rows=data.skip_bad_rows,
                                     row_check=reward_check(cfg), sample=SAMPLE_ROWS)
            else:
                load_prompts(files, tokenizer, prompt_key=data.prompt_key, max_prompt_length=data.max_prompt_length,
                             truncation=data.truncation, skip_bad_rows=data.skip_bad_rows,
                             row_check=reward_check(cfg), sample=SAMPLE_ROWS)
                checked = min(total, SAMPLE_ROWS * len(files))
        except DatasetError as err:
            raise DatasetError(f"data.{key}: {err}") from None
        if checked < total:
            log.info(f"data.{key}: checked a sample of {checked} of {total} rows; the rest are checked as they load")
