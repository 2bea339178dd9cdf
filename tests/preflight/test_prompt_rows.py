"""Prompts the preflight must catch before a run starts, and the full load for every row: a prompt that
renders to zero tokens, a chat list stored as JSON text, string and chat prompts mixed in one file
(which conf/data/default.yaml allows: it must train). Each refusal is one line naming file and row."""

from __future__ import annotations

import json
import logging

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from logicrl.config import compose, validate
from logicrl.config.phases import ARR
from logicrl.data.dataset import DatasetError, _sample, check_rows, collate_prompts, load_prompts
from logicrl.preflight import data as preflight_data
from logicrl.preflight.data import check_data

TRUTH = {"style": "rule", "ground_truth": {"name": "Zoey", "role": "knight"}}
CHAT = [{"role": "user", "content": "Zoey says she is a knight."}]
# A chat list that reaches the tokenizer as nothing: the base template joins its contents, here "".
EMPTY_BASE = {"prompt": [{"role": "user", "content": ""}], "extra_info": {"template": "base"}}
JSON_TEXT = json.dumps(CHAT)  # what json.dumps of the column before writing the file leaves
SKIP = "fix the row, or set data.skip_bad_rows=true to skip bad rows (they are counted)"


def row(prompt=CHAT, **fields) -> dict:
    return {"prompt": prompt, "data_source": "kk_role", "reward_model": TRUTH, **fields}


def jsonl(path, rows) -> str:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def config(train: str, *overrides: str):
    cfg, _, _ = validate(compose([f"data.train_files={train}", f"data.val_files={train}", f"{ARR}.rollout.name=hf",
                                  "data.train_batch_size=2", f"{ARR}.actor.ppo_mini_batch_size=2", *overrides]))
    return cfg


def load(path, tokenizer, **kwargs):
    return load_prompts(path, tokenizer, max_prompt_length=256, **kwargs)


def test_a_prompt_that_renders_to_zero_tokens_is_refused_by_the_preflight(tmp_path, tokenizer):
    train = jsonl(tmp_path / "train.jsonl", [row() for _ in range(5)] + [row(**EMPTY_BASE)])
    check_data(config(train), None)  # the row's shape is fine: only the tokenizer finds it
    with pytest.raises(DatasetError) as err:
        check_data(config(train), tokenizer)
    assert str(err.value) == (f"data.train_files: {train} row 5: the prompt renders to 0 tokens (''): give it text "
                              f"the tokenizer encodes; {SKIP}")


def test_the_full_load_checks_the_rows_the_preflight_sample_left_out(tmp_path, tokenizer, monkeypatch):
    monkeypatch.setattr(preflight_data, "SAMPLE_ROWS", 4)
    unsampled = next(i for i in range(40) if i not in _sample(40, 4))
    rows = [row() for _ in range(40)]
    rows[unsampled] = row(**EMPTY_BASE)
    train = jsonl(tmp_path / "train.jsonl", rows)
    check_data(config(train), tokenizer)  # 4 of 40 rows, not that one
    with pytest.raises(DatasetError, match=rf"^{train} row {unsampled}: the prompt renders to 0 tokens"):
        load(train, tokenizer)  # the trainer's load: main_ppo prints it as one line, exit 2


@pytest.mark.parametrize("suffix", ["jsonl", "parquet"])
def test_a_chat_list_stored_as_json_text_is_refused_with_and_without_a_tokenizer(tmp_path, tokenizer, suffix):
    rows = [row() for _ in range(3)] + [row(JSON_TEXT)]
    if suffix == "parquet":  # the usual source: a column json.dumps'ed so that one type fits every row
        rows = [{**r, "prompt": JSON_TEXT if isinstance(r["prompt"], str) else "a plain question"} for r in rows]
        train = str(tmp_path / "train.parquet")
        pq.write_table(pa.Table.from_pylist(rows), train)
    else:
        train = jsonl(tmp_path / "train.jsonl", rows)
    says = (f"{train} row 3: prompt is a string holding a JSON chat list ('[{{\"role\": \"user\", \"content\": "
            f"\"Zoey says '...), which would be trained on as literal text: store the list itself (json.loads the "
            f"column before writing the file); {SKIP}")
    for tok in (None, tokenizer):  # a dry run's row check, then the real preflight's
        with pytest.raises(DatasetError) as err:
            check_data(config(train), tok)
        assert str(err.value) == f"data.train_files: {says}"
    with pytest.raises(DatasetError) as err:
        load(train, tokenizer)
    assert str(err.value) == says


def test_text_that_only_looks_like_json_is_a_prompt(tmp_path, tokenizer):
    prompts = ["[1, 2, 3]", "[not json]", '[{"a": 1}]', "[]", " Who is a knight? "]
    loaded = load(jsonl(tmp_path / "train.jsonl", [row(p) for p in prompts]), tokenizer)
    assert [r.prompt_text for r in loaded] == prompts


def test_an_empty_or_blank_string_prompt_is_refused_like_an_empty_chat_list(tmp_path):
    train = jsonl(tmp_path / "train.jsonl", [row(), row("  \n")])
    with pytest.raises(DatasetError, match=rf"^{train} row 1: prompt is an empty string; fix the row"):
        check_rows(train)


def test_skipping_bad_rows_counts_these_like_any_other(tmp_path, tokenizer, caplog):
    train = jsonl(tmp_path / "train.jsonl", [row(), row(JSON_TEXT), row(**EMPTY_BASE), row("")])
    with caplog.at_level(logging.WARNING, logger="logicrl.data"):
        loaded = load(train, tokenizer, skip_bad_rows=True)
    assert [r.row_index for r in loaded] == [0] and loaded.bad_rows_skipped == 3
    assert "skipped 3 bad rows of 4" in caplog.text


def test_string_and_chat_prompts_mixed_in_one_file_load_and_batch(tmp_path, tokenizer):
    # Before: collate_prompts raised in tensordict at the first step that sampled both kinds.
    mixed = [row("Zoey says she is a knight. Who is?"), row(), row([*CHAT, {"role": "assistant", "content": "Zoey"}])]
    train = jsonl(tmp_path / "train.jsonl", mixed)
    check_data(config(train), tokenizer)
    loaded = load(train, tokenizer)
    assert loaded[0].prompt_text == mixed[0]["prompt"]  # a string is the text itself
    assert loaded[1].prompt_text.startswith("<|im_start|>") and loaded[2].prompt_text.endswith("Zoey")
    batch = collate_prompts(list(loaded), pad_id=tokenizer.pad_token_id)
    raw = [r["prompt"] for r in mixed]
    assert batch["raw_prompt"] == raw and all(type(a) is type(b) for a, b in zip(batch["raw_prompt"], raw))
    # What the step does to a batch keeps each row's prompt whole and in line with its tokens.
    assert batch.repeat_interleave(2)["raw_prompt"] == [p for p in raw for _ in range(2)]
    assert batch[torch.tensor([2, 0])]["raw_prompt"] == [raw[2], raw[0]]
    assert [part["raw_prompt"] for part in batch.split(2)] == [raw[:2], raw[2:]]
    assert torch.cat([batch, batch])["raw_prompt"] == raw + raw
    assert batch[1]["raw_prompt"] == raw[1]
