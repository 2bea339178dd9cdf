"""The sequence lengths the memory plan is for: full lengths (worst_case), or expected ones.

    lengths = plan_lengths(cfg, packed)    # Lengths(prompt, response, note)

worst_case (trainer.memory_plan's default) plans every prompt and response at its configured maximum:
a plan that fits then fits at step 500, when responses have grown. `expected` plans prompts as
measured by the model's tokenizer on the rows the preflight samples (the longest when rows are
padded, since a step pads to its longest; the mean when packed, since a micro-batch holds the sum
of its rows' real tokens) and responses at trainer.expected_response_length, else the largest
response_length/mean a resumed checkpoint recorded, else the maximum. Padded responses always take
data.max_response_length columns, so there the full length is used. Past the length where a phase
stops fitting (fit.stop_lengths) a run relies on token budgets and OOM recovery. docs/memory.md
("Planning modes") has the worked example.
"""

from __future__ import annotations

import functools
import json
import math
import statistics
from dataclasses import dataclass
from pathlib import Path

from omegaconf import DictConfig

from logicrl.checkpoint_layout import STATE_FILE, newest_resumable
from logicrl.config.errors import ConfigError
from logicrl.config.plan import ARR

WORST_CASE, EXPECTED = "worst_case", "expected"
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")  # fast, sentencepiece, BPE vocab


@dataclass(frozen=True)
class Lengths:
    prompt: int
    response: int
    note: str  # where they come from, for the plan's first line


def plan_lengths(cfg: DictConfig, packed: bool) -> Lengths:
    data = cfg.data
    if cfg.trainer.memory_plan == WORST_CASE:
        return Lengths(data.max_prompt_length, data.max_response_length,
                       "full lengths: data.max_prompt_length + data.max_response_length")
    prompts = measured_prompt_lengths(cfg)
    if packed:
        prompt, how = max(1, round(statistics.fmean(prompts))), "mean (packed: a micro-batch holds its rows' sum)"
    else:
        prompt, how = max(prompts), "longest (padded: a step's rows pad to its longest prompt)"
    prompt_note = f"prompts {prompt} tokens, the {how} of {len(prompts)} sampled rows"
    if not packed:
        return Lengths(prompt, data.max_response_length,
                       f"{prompt_note}; responses data.max_response_length={data.max_response_length} "
                       "(padded: every response has that many columns)")
    response, source = expected_response(cfg)
    return Lengths(prompt, response, f"{prompt_note}; responses {response} tokens ({source})")


def expected_response(cfg: DictConfig) -> tuple[int, str]:
    """(response length, where it comes from): the config, the resumed checkpoint's history, or the cap."""
    t, cap = cfg.trainer, cfg.data.max_response_length
    if t.expected_response_length is not None:
        return t.expected_response_length, "trainer.expected_response_length"
    seen = last_run_response_length(t.default_local_dir, t.resume_mode)
    if seen is not None:
        length, where = seen
        return min(cap, length), f"the largest response_length/mean in {where}"
    return cap, "data.max_response_length: no trainer.expected_response_length and no run to resume"


def last_run_response_length(root: str, resume_mode: str) -> tuple[int, str] | None:
    """(the largest mean response length, rounded up, the checkpoint) of the run this one resumes, or
    None: nothing to resume, or a checkpoint written before its history kept lengths.

    The checkpoint auto resumes (logicrl/checkpoint_layout.py: the one `latest` names) or the one
    resume_mode names, and its state file. Only read: a damaged one is the trainer's to set aside."""
    if resume_mode == "disable":
        return None
    if resume_mode == "auto":
        path = newest_resumable(root)
        if path is None:
            return None
    else:
        path = Path(resume_mode)
    try:
        history = json.loads((path / STATE_FILE).read_text()).get("extra", {}).get("history", [])
    except (OSError, ValueError):
        return None
    lengths = [row["len_mean"] for row in history if isinstance(row, dict) and "len_mean" in row]
    return (math.ceil(max(lengths)), str(path)) if lengths else None


def measured_prompt_lengths(cfg: DictConfig, rows: int | None = None) -> list[int]:
    """Token counts of a sample of data.train_files' prompts (`rows` per file, the preflight's sample by
    default), rendered and tokenized as training does: with the run's tool schemas, which a chat template
    lists in the prompt (multi-turn runs)."""
    from logicrl.config.multi_turn import prompt_tools
    from logicrl.data.dataset import SAMPLE_ROWS

    data, path = cfg.data, cfg[ARR].model.path
    tools = prompt_tools(cfg)
    return list(_measured(path, tuple(_as_list(data.train_files)), data.prompt_key, data.max_prompt_length,
                          data.truncation, data.skip_bad_rows, json.dumps(tools) if tools else None,
                          rows or SAMPLE_ROWS))


@functools.lru_cache(maxsize=4)  # a curriculum's stages often share model and data
def _measured(path: str, files: tuple[str, ...], prompt_key: str, max_prompt_length: int, truncation: str,
              skip_bad_rows: bool, tools: str | None, sample: int) -> tuple[int, ...]:
    from logicrl.data.dataset import load_prompts
    from logicrl.models.loading import checkpoint_dir, load_tokenizer

    fix = "copy the checkpoint's tokenizer files there, or use trainer.memory_plan=worst_case"
    where = f"trainer.memory_plan=expected measures prompts with the tokenizer of {ARR}.model.path={path}"
    # AutoTokenizer may hand back an empty tokenizer for a config-only directory (logicrl/memory/shapes/),
    # which would measure every prompt at 0 tokens: ask for the files first.
    if not any((checkpoint_dir(path) / name).is_file() for name in TOKENIZER_FILES):
        raise ConfigError(f"{where}, but it has no tokenizer ({', '.join(TOKENIZER_FILES)}): {fix}")
    try:
        tokenizer = load_tokenizer(path, quiet=True)
    except Exception as err:  # noqa: BLE001 - transformers raises many kinds for a broken tokenizer
        raise ConfigError(f"{where}, which does not load ({type(err).__name__}): {fix}") from None
    rows = load_prompts(list(files), tokenizer, prompt_key=prompt_key, max_prompt_length=max_prompt_length,
                        truncation=truncation, skip_bad_rows=skip_bad_rows, sample=sample,
                        tools=json.loads(tools) if tools else None)
    if not len(rows) or not any(len(r.input_ids) for r in rows):
        raise ConfigError("trainer.memory_plan=expected found no usable prompt in data.train_files to measure: "
                          "use trainer.memory_plan=worst_case")
    return tuple(len(r.input_ids) for r in rows)


def _as_list(files) -> list[str]:
    from logicrl.data.files import as_paths

    return as_paths(files)
