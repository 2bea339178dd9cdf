"""What a run reads from its data files: readable, rows well formed and scorable, prompts within bounds.

    check_data(cfg, None)        # no tokenizer (a dry run, or before the model checks): rows and rewards
    check_data(cfg, tokenizer)   # the real run: prompts rendered, tokenized, data.truncation applied

Up to SAMPLE_ROWS rows of each file are checked here, in a second or two however large the file;
the trainer's full load checks the rest with the same code (config/rewards.py's row check), and
a problem it finds there is the same one-line error (main_ppo catches BadInput anywhere).
"""

from __future__ import annotations

import logging

from omegaconf import DictConfig

from logicrl.config.multi_turn import prompt_tools
from logicrl.config.rewards import reward_check
from logicrl.data.dataset import SAMPLE_ROWS, DatasetError, check_rows, load_prompts
from logicrl.data.files import as_paths, dataset_rows

log = logging.getLogger("logicrl.preflight")


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
                             row_check=reward_check(cfg), sample=SAMPLE_ROWS, tools=prompt_tools(cfg))
                checked = min(total, SAMPLE_ROWS * len(files))
        except DatasetError as err:
            raise DatasetError(f"data.{key}: {err}") from None
        if checked < total:
            log.info(f"data.{key}: checked a sample of {checked} of {total} rows; the rest are checked as they load")
