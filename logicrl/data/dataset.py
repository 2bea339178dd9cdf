"""Prompt datasets: verl-schema rows from parquet or jsonl, checked, rendered and tokenized.

    ds = load_prompts(cfg.data.train_files, tokenizer, max_prompt_length=cfg.data.max_prompt_length,
                      truncation=cfg.data.truncation, skip_bad_rows=cfg.data.skip_bad_rows)
    batch = collate_prompts([ds[i] for i in indices], pad_id=tokenizer.pad_token_id)

A row needs `prompt` (or `data.prompt_key`: a chat list [{role, content}] or a string),
`data_source` and `reward_model.ground_truth`; `extra_info` is optional. A row without them
stops loading with a one-line DatasetError naming the file and the row index (0-based,
counting rows of a parquet file or non-blank lines of a jsonl file), unless skip_bad_rows.
How a prompt becomes text is in prompts.py.

Everything is loaded and tokenized up front: the K&K sets are a few thousand prompts, and
knowing every length before training is what lets `data.truncation=error` fail at once
rather than at step 500.
"""

from __future__ import annotations

import itertools
import json
import logging
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from logicrl.data.files import DATA_SUFFIXES, as_paths
from logicrl.data.prompts import message_problem, render_prompt, text_problem
from logicrl.errors import BadInput

log = logging.getLogger("logicrl.data")

TRUNCATION_MODES = ("error", "filter", "left", "right")
# Rows per file read before a run starts (the preflight's row check, the planner's prompt lengths):
# rendering and tokenizing that many prompts takes about a second.
SAMPLE_ROWS = 2_000
# Prompts tokenized per call: a chunk's texts and ids are held at once.
ENCODE_BATCH = 1024
_SKIP_HINT = "fix the row, or set data.skip_bad_rows=true to skip bad rows (they are counted)"


class DatasetError(BadInput):
    """A data file or row that cannot be used; the message is one line naming the file, the row and the fix."""


class _BadRow(Exception):
    """One row's problem, "<file> row <i>: <what>"; load_prompts raises it as a DatasetError or counts it."""


@dataclass(frozen=True)
class PromptRow:
    input_ids: list[int]  # the prompt's tokens, at most max_prompt_length
    prompt_text: str  # the text input_ids encode (after truncation, if any)
    data_source: str  # picks the reward function
    ground_truth: Any  # reward_model.ground_truth, as stored
    extra_info: dict
    file: str  # where the row came from: for error messages and resuming the data order
    row_index: int
    # The prompt as the file holds it (a chat list or a string), before any template: what a reward
    # model with its own tokenizer re-renders the response into (models/rm_inputs.py).
    raw_prompt: Any = None


@dataclass
class PromptDataset(Sequence[PromptRow]):
    """Tokenized prompts in file order; a torch DataLoader takes it as a map-style dataset."""

    rows: list[PromptRow]
    bad_rows_skipped: int = 0  # rows dropped by skip_bad_rows
    too_long_filtered: int = 0  # rows dropped by truncation=filter
    truncated: int = 0  # rows cut by truncation=left
    files: list[str] = field(default_factory=list)

    def __len__(self) -> int:
        return len(self.rows)

    def __getitem__(self, index):
        return self.rows[index]


def load_prompts(
    files: str | Sequence[str],
    tokenizer: Any,
    *,
    prompt_key: str = "prompt",
    max_prompt_length: int,
    truncation: str = "error",
    skip_bad_rows: bool = False,
    row_check: Callable[[str, Any], str | None] | None = None,
    sample: int | None = None,
    tools: list[dict] | None = None,
) -> PromptDataset:
    """Read `files` (one path or a list; .parquet or .jsonl) into tokenized prompts.

    Over-long prompts (more than max_prompt_length tokens) follow `truncation`: "error" raises
    naming the first one, "filter" drops them, "left" cuts tokens from the start (keeping the
    end, where the question and the opened assistant turn are: what generation continues from).
    Every prompt ends where the assistant's turn opens, so "right" would cut that away: it is
    refused when a prompt is over-long. What was dropped or cut is logged with its count.

    `row_check(data_source, ground_truth)` is the caller's check of a row's reward fields (the
    reward lives above this package); a problem it returns is a bad row like any other.
    `sample`: check at most that many rows per file (the preflight's look: see `_sample`); the
    dataset then holds only those, and nothing is logged. `tools`: the tool schemas a chat template lists
    (multi-turn rollouts; data/prompts.py).
    """
    if truncation not in TRUNCATION_MODES:
        raise ValueError(f"data.truncation={truncation!r} must be one of {', '.join(TRUNCATION_MODES)}")
    if max_prompt_length < 1:
        raise ValueError(f"data.max_prompt_length={max_prompt_length} must be at least 1")
    paths = as_paths(files)
    if not paths:
        raise DatasetError("no data files given: set data.train_files / data.val_files to .parquet or .jsonl paths")

    rows: list[PromptRow] = []
    bad: list[str] = []
    total = 0
    say = (lambda message: None) if sample else log.warning  # the trainer's full load says it once
    for path in paths:
        records = _read(path, sample)
        while chunk := list(itertools.islice(records, ENCODE_BATCH)):
            total += len(chunk)
            for row in _prompt_rows(chunk, path, tokenizer, prompt_key, row_check, tools):
                if isinstance(row, _BadRow):
                    if not skip_bad_rows:
                        raise DatasetError(f"{row}; {_SKIP_HINT}") from row.__cause__
                    bad.append(str(row))
                else:
                    rows.append(row)
    where = paths[0] if len(paths) == 1 else f"{len(paths)} files ({paths[0]}, ...)"
    if bad:
        # Only the first problem is shown: one line in the log, whatever the count.
        say(f"data: skipped {len(bad)} bad rows of {total} in {where} (data.skip_bad_rows=true); first: {bad[0]}")

    dataset = PromptDataset([], bad_rows_skipped=len(bad), files=paths)
    too_long = [r for r in rows if len(r.input_ids) > max_prompt_length]
    if too_long and truncation == "error":
        first = too_long[0]
        raise DatasetError(
            f"{first.file} row {first.row_index}: prompt is {len(first.input_ids)} tokens, more than "
            f"data.max_prompt_length={max_prompt_length} ({len(too_long)} of {len(rows)} prompts in {where} are); "
            f"raise data.max_prompt_length, or set data.truncation=filter to drop such prompts "
            f"or data.truncation=left to keep their last tokens"
        )
    if too_long and truncation == "right":
        first = too_long[0]
        raise DatasetError(
            f"{first.file} row {first.row_index}: data.truncation=right would cut the end of this "
            f"{len(first.input_ids)}-token prompt, where the assistant's turn opens ({len(too_long)} of {len(rows)} "
            f"prompts in {where} are longer than data.max_prompt_length={max_prompt_length}); use "
            f"data.truncation=left (keeps the end) or filter, or raise data.max_prompt_length")
    if too_long and truncation == "filter":
        say(f"data: dropped {len(too_long)} of {len(rows)} prompts longer than "
            f"data.max_prompt_length={max_prompt_length} tokens from {where} (data.truncation=filter)")
        dataset.too_long_filtered = len(too_long)
        rows = [r for r in rows if len(r.input_ids) <= max_prompt_length]
    elif too_long:
        say(f"data: cut {len(too_long)} of {len(rows)} prompts in {where} to their last "
            f"data.max_prompt_length={max_prompt_length} tokens (data.truncation=left)")
        dataset.truncated = len(too_long)
        rows = [_cut(r, max_prompt_length, tokenizer) for r in rows]

    if not rows:
        raise DatasetError(f"{where}: no prompts left to train on ({total} rows, {len(bad)} bad, "
                           f"{dataset.too_long_filtered} longer than data.max_prompt_length={max_prompt_length})")
    dataset.rows = rows
    return dataset


def check_rows(files: str | Sequence[str], *, prompt_key: str = "prompt", skip_bad_rows: bool = False,
               row_check: Callable[[str, Any], str | None] | None = None, sample: int | None = None) -> int:
    """The checks of `load_prompts` that need no tokenizer (a dry run's), on `sample` rows per file;
    returns the rows checked. Raises the DatasetError `load_prompts` would."""
    checked, good = 0, 0
    for path in as_paths(files):
        for index, record in _read(path, sample):
            checked += 1
            problem = str(record) if isinstance(record, _BadRow) else row_problem(record, prompt_key)
            if problem is None and row_check is not None:
                problem = row_check(record["data_source"], record["reward_model"]["ground_truth"])
            if problem is None:
                good += 1
            elif not skip_bad_rows:
                where = "" if isinstance(record, _BadRow) else f"{path} row {index}: "
                raise DatasetError(f"{where}{problem}; {_SKIP_HINT}")
    if checked and not good:
        raise DatasetError(f"{as_paths(files)[0]}: every row checked is bad ({checked} rows, data.skip_bad_rows=true)")
    return checked


def _sample(total: int, limit: int | None) -> list[int] | None:
    """The row indices the preflight checks: all of them up to `limit`, else the first half of
    `limit` (where a file's own header mistakes show) and a seeded random half of the rest, in order."""
    if limit is None or total <= limit:
        return None
    import random

    head = limit // 2
    return list(range(head)) + sorted(random.Random(0).sample(range(head, total), limit - head))


def _read(path: str, sample: int | None = None) -> Iterator[tuple[int, Any]]:
    """(row index, record) for every row of one file (or of `_sample`'s rows); a jsonl line that
    is not JSON yields a _BadRow. A file that cannot be read at all raises a one-line DatasetError."""
    if path.endswith(".parquet"):
        import pyarrow.parquet as pq

        try:
            # The whole table, even when sampling: reading every column chunk is what finds a
            # corrupt file, and it is fast (columnar); only the rows checked become Python objects.
            table = pq.read_table(path)
        except (OSError, ValueError) as err:  # pyarrow's ArrowInvalid is a ValueError
            if isinstance(err, FileNotFoundError):
                raise
            raise DatasetError(f"{path}: cannot be read as parquet ({' '.join(str(err).split())[:200]}): "
                               f"rewrite it, or point the data key at another file") from None
        indices = _sample(table.num_rows, sample)
        if indices is not None:
            table = table.take(indices)
        for offset, batch in enumerate(table.to_batches(max_chunksize=1024)):
            for i, record in enumerate(batch.to_pylist()):  # plain dicts and lists, unlike pandas' numpy arrays
                position = offset * 1024 + i
                yield (position if indices is None else indices[position]), record
    elif path.endswith(".jsonl"):
        try:
            with open(path, encoding="utf-8") as f:
                # Blank lines are not rows, as in files.count_rows, so indices agree with the row count.
                lines = [line for line in f if line.strip()]
        except UnicodeDecodeError as err:
            raise DatasetError(f"{path}: is not UTF-8 text ({err.reason} at byte {err.start}): "
                               f"a .jsonl file holds one JSON object per line") from None
        indices = _sample(len(lines), sample) or range(len(lines))
        for index in indices:
            try:
                yield index, json.loads(lines[index])
            except json.JSONDecodeError as err:
                yield index, _BadRow(f"{path} row {index}: not valid JSON ({err.msg} at column {err.colno})")
    else:
        raise DatasetError(f"{path}: data files must end in {' or '.join(DATA_SUFFIXES)}")


def _prompt_rows(read: list[tuple[int, Any]], path: str, tokenizer: Any, prompt_key: str,
                 row_check: Callable[[str, Any], str | None] | None = None,
                 tools: list[dict] | None = None) -> list[PromptRow | _BadRow]:
    """Check and render `read`'s records (index, record), then tokenize their prompts in one call per
    add_special_tokens value; each record's PromptRow, or the _BadRow naming it, in order."""
    out: list[PromptRow | _BadRow | tuple[str, bool]] = []
    for index, record in read:
        try:
            out.append(_rendered(record, path, index, tokenizer, prompt_key, row_check, tools))
        except _BadRow as err:
            out.append(err)
    for special in (True, False):
        at = [i for i, item in enumerate(out) if isinstance(item, tuple) and item[1] is special]
        if at:
            # One call for many texts: a fast tokenizer's per-call overhead is most of a short prompt's cost.
            ids = tokenizer([out[i][0] for i in at], add_special_tokens=special)["input_ids"]
            for i, input_ids in zip(at, ids, strict=True):
                out[i] = _row(read[i][1], path, read[i][0], prompt_key, out[i][0], list(input_ids))
    return out


def _rendered(record: Any, path: str, index: int, tokenizer: Any, prompt_key: str,
              row_check: Callable[[str, Any], str | None] | None = None,
              tools: list[dict] | None = None) -> tuple[str, bool]:
    """Check one record and render its prompt: (text, add_special_tokens); a problem raises _BadRow naming the row."""
    if isinstance(record, _BadRow):
        raise record
    problem = row_problem(record, prompt_key)
    if problem is None and row_check is not None:
        problem = row_check(record["data_source"], record["reward_model"]["ground_truth"])
    if problem:
        raise _BadRow(f"{path} row {index}: {problem}")
    try:
        return render_prompt(record[prompt_key], tokenizer, record.get("extra_info") or {}, tools)
    except Exception as err:  # noqa: BLE001 - a user's Jinja template can raise anything; it is this row's fault
        raise _BadRow(f"{path} row {index}: the tokenizer's chat template failed on this prompt "
                      f"({type(err).__name__}: {' '.join(str(err).split())})") from err


def _row(record: dict, path: str, index: int, prompt_key: str, text: str, input_ids: list[int]) -> PromptRow | _BadRow:
    if not input_ids:
        # Generation needs at least one token to continue from: this row would end the run at its step.
        return _BadRow(f"{path} row {index}: the prompt renders to 0 tokens ({text[:40]!r}): give it text the "
                       "tokenizer encodes")
    return PromptRow(
        input_ids=input_ids,
        prompt_text=text,
        data_source=record["data_source"],
        ground_truth=record["reward_model"]["ground_truth"],
        extra_info=record.get("extra_info") or {},
        file=path,
        row_index=index,
        raw_prompt=record[prompt_key],
    )


def row_problem(record: Any, prompt_key: str) -> str | None:
    """What makes one record unusable as a prompt row, or None."""
    if not isinstance(record, dict):
        return f"row is {type(record).__name__}, expected a mapping of columns"
    prompt = record.get(prompt_key)
    if prompt is None:
        return f"no '{prompt_key}' (data.prompt_key)"
    if isinstance(prompt, list):
        if problem := message_problem(prompt):
            return problem
    elif isinstance(prompt, str):
        if problem := text_problem(prompt):
            return problem
    else:
        return f"'{prompt_key}' is {type(prompt).__name__}, expected a chat list [{{role, content}}] or a string"
    data_source = record.get("data_source")
    if not data_source:
        return "no data_source (it picks the reward function)"
    if not isinstance(data_source, str):
        return f"data_source is {type(data_source).__name__}, expected a string"
    reward_model = record.get("reward_model")
    if not isinstance(reward_model, dict) or reward_model.get("ground_truth") is None:
        return "no reward_model.ground_truth"
    extra_info = record.get("extra_info")
    if extra_info is not None and not isinstance(extra_info, dict):
        return f"extra_info is {type(extra_info).__name__}, expected a mapping"
    return None


def _cut(row: PromptRow, length: int, tokenizer: Any) -> PromptRow:
    """The row with only its last `length` tokens (data.truncation=left)."""
    if len(row.input_ids) <= length:
        return row
    ids = row.input_ids[-length:]
    # prompt_text keeps describing input_ids, so logs and samples show what the model saw.
    text = tokenizer.decode(ids, skip_special_tokens=False)
    return PromptRow(ids, text, row.data_source, row.ground_truth, row.extra_info, row.file, row.row_index,
                     row.raw_prompt)


# The rows' fields that ride along a batch as lists (tensordict NonTensorStacks), not tensors.
NON_TENSOR_FIELDS = ("prompt_text", "data_source", "ground_truth", "extra_info", "file", "row_index", "raw_prompt")


def collate_prompts(rows: Sequence[PromptRow], pad_id: int):
    """A TensorDict of batch size [B]: left-padded prompt tensors plus the rows' other fields.

    Tensors, all [B, P] with P the longest prompt in the batch:
        input_ids       pad_id on the left, so every prompt ends at column P-1 and generation
                        appends at the same position for the whole batch
        attention_mask  1 on tokens, 0 on padding (int64, as verl)
        position_ids    0, 1, ... from each prompt's first real token; 0 on padding
    Non-tensor fields, one entry per row, as tensordict NonTensorStacks (so indexing, chunk,
    cat and repeat_interleave keep them aligned with the tensors; `td["data_source"]` reads
    back as a list): prompt_text, data_source, ground_truth, extra_info, file, row_index, raw_prompt.
    """
    import torch
    from tensordict import NonTensorData, NonTensorStack, TensorDict

    if not rows:
        raise ValueError("collate_prompts needs at least one row")
    width = max(len(r.input_ids) for r in rows)
    input_ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, r in enumerate(rows):
        if r.input_ids:
            input_ids[i, width - len(r.input_ids):] = torch.tensor(r.input_ids, dtype=torch.long)
            attention_mask[i, width - len(r.input_ids):] = 1
    position_ids = (attention_mask.cumsum(dim=-1) - 1).clamp(min=0)
    batch = TensorDict({"input_ids": input_ids, "attention_mask": attention_mask, "position_ids": position_ids},
                       batch_size=[len(rows)])
    for name in NON_TENSOR_FIELDS:
        # A list value (a chat prompt, a list ground truth) is wrapped as one entry: from_list would make it
        # a nested stack, and a batch mixing it with strings (the prompts of one file may mix) cannot stack.
        values = [NonTensorData(data=v) if isinstance(v, list) else v for v in (getattr(r, name) for r in rows)]
        batch[name] = NonTensorStack.from_list(values)
    return batch
