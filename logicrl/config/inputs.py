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

from omegaconf import DictConfig

from logicrl.config.errors import ConfigError
from logicrl.config.plan import ARR, uses_critic
from logicrl.data.dataset import DatasetError, check_rows, load_prompts
from logicrl.data.files import as_paths, dataset_rows
from logicrl.models.spec import load_model_spec
from logicrl.models.tiny import EMBEDDED_CONFIGS
from logicrl.reward import ground_truth_problem

log = logging.getLogger("logicrl.config")
SAMPLE_ROWS = 2_000  # per file; rendering and tokenizing that many prompts takes about a second


def reward_check(cfg: DictConfig):
    """The row check for the rewards this run uses: a custom reward takes every data_source and
    its ground truth is its own business (calling it here could be slow or have side effects)."""
    return None if cfg.reward.custom.path else ground_truth_problem


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
