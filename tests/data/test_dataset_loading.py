"""Loading prompt datasets: formats, templates, truncation modes, bad rows, left-padded batches."""

import json
import logging

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import torch

from logicrl.data.dataset import DatasetError, PromptRow, collate_prompts, load_prompts
from logicrl.data.kk.build import build_splits, write_parquet
from logicrl.data.prompts import render_prompt
from logicrl.models.tiny import load_tiny_tokenizer

GROUND_TRUTH = {"reward_model": {"style": "rule", "ground_truth": "42"}}



@pytest.fixture
def plain_tokenizer(cache):
    """The tiny tokenizer without a chat template."""
    tok = load_tiny_tokenizer(cache)
    tok.chat_template = None
    return tok


@pytest.fixture(scope="module")
def kk_rows():
    return build_splits(3, 6, 2, "qwen-instruct", seed=3)["train"]


def write_jsonl(path, records):
    path.write_text("".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records))
    return str(path)


def row(prompt, **fields):
    return {"prompt": prompt, "data_source": "test", **GROUND_TRUTH, **fields}


def load(tmp_path, records, tokenizer, **kwargs):
    kwargs.setdefault("max_prompt_length", 512)
    return load_prompts(write_jsonl(tmp_path / "rows.jsonl", records), tokenizer, **kwargs)


def test_parquet_and_jsonl_give_the_same_rows(tmp_path, tokenizer, kk_rows):
    parquet = str(write_parquet(kk_rows, tmp_path / "train.parquet"))
    jsonl = write_jsonl(tmp_path / "train.jsonl", kk_rows)
    from_parquet = load_prompts(parquet, tokenizer, max_prompt_length=512)
    from_jsonl = load_prompts([jsonl], tokenizer, max_prompt_length=512)
    assert len(from_parquet) == len(from_jsonl) == len(kk_rows)
    for a, b, source in zip(from_parquet, from_jsonl, kk_rows):
        assert (a.file, b.file) == (parquet, jsonl)
        assert a.row_index == b.row_index == source["extra_info"]["index"]
        assert a.input_ids == b.input_ids
        assert a.prompt_text == b.prompt_text
        assert a.data_source == b.data_source == "kk_logic"
        assert a.ground_truth == b.ground_truth == source["reward_model"]["ground_truth"]
        assert a.extra_info == b.extra_info == source["extra_info"]
    both = load_prompts([parquet, jsonl], tokenizer, max_prompt_length=512)
    assert [(r.file, r.row_index) for r in both] == [(parquet, i) for i in range(6)] + [(jsonl, i) for i in range(6)]


def test_kk_instruct_prompt_continues_the_opened_think(tokenizer, tmp_path, kk_rows):
    first = load(tmp_path, kk_rows[:1], tokenizer)[0]
    quiz = kk_rows[0]["extra_info"]["quiz"]
    assert first.prompt_text.startswith("<|im_start|>system\nYou are a helpful assistant.")
    assert first.prompt_text.endswith(f"<|im_start|>user\n{quiz}<|im_end|>\n<|im_start|>assistant\n<think>")
    assert first.input_ids[-1] == tokenizer.convert_tokens_to_ids("<think>")
    assert first.input_ids == tokenizer.encode(first.prompt_text, add_special_tokens=False)


def test_base_template_prompt_is_used_as_is(tokenizer, tmp_path):
    base = build_splits(3, 2, 1, "base", seed=3)["train"]
    loaded = load(tmp_path, base, tokenizer)
    for source, prompt in zip(base, loaded):
        assert prompt.prompt_text == source["prompt"][0]["content"]
        assert prompt.prompt_text.endswith("Assistant: <think>") and "<|im_start|>" not in prompt.prompt_text


@pytest.mark.parametrize("prompt, expected", [
    ([{"role": "system", "content": "S"}, {"role": "user", "content": "U"}], "System: S\nUser: U\nAssistant:"),
    ([{"role": "user", "content": "U"}, {"role": "assistant", "content": "<think>"}], "User: U\nAssistant: <think>"),
    ("Just text.", "Just text."),
])
def test_plain_template_without_a_chat_template(plain_tokenizer, tmp_path, prompt, expected):
    assert load(tmp_path, [row(prompt)], plain_tokenizer)[0].prompt_text == expected


def test_chat_template_adds_a_generation_prompt_after_a_user_turn(tokenizer, tmp_path):
    loaded = load(tmp_path, [row([{"role": "user", "content": "U"}]), row("Plain string.")], tokenizer)
    assert loaded[0].prompt_text == "<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
    assert loaded[1].prompt_text == "Plain string."  # a string prompt is never templated


# Hand-sized: "Zoey is a knight." is 5 tokens (Zoey, Ġis, Ġa, Ġknight, .), the other 10.
SHORT, LONG = "Zoey is a knight.", "Zoey is a knight. Oliver is a knave."


def test_truncation_error_names_the_row_and_the_keys(tokenizer, tmp_path):
    assert [len(tokenizer.encode(t)) for t in (SHORT, LONG)] == [5, 10]
    with pytest.raises(DatasetError) as err:
        load(tmp_path, [row(SHORT), row(LONG)], tokenizer, max_prompt_length=6)
    message = str(err.value)
    assert f"{tmp_path / 'rows.jsonl'} row 1: prompt is 10 tokens" in message
    assert "data.max_prompt_length=6" in message and "data.truncation=filter" in message


def test_truncation_filter_drops_and_logs_one_line(tokenizer, tmp_path, caplog):
    with caplog.at_level(logging.INFO, logger="logicrl.data"):
        loaded = load(tmp_path, [row(LONG), row(SHORT), row(LONG)], tokenizer, max_prompt_length=6,
                      truncation="filter")
    assert [r.prompt_text for r in loaded] == [SHORT] and loaded[0].row_index == 1
    assert loaded.too_long_filtered == 2
    assert [r.getMessage() for r in caplog.records] == [
        f"data: dropped 2 of 3 prompts longer than data.max_prompt_length=6 tokens from "
        f"{tmp_path / 'rows.jsonl'} (data.truncation=filter)"]


def test_left_truncation_keeps_the_end_and_is_counted(tokenizer, tmp_path, caplog):
    full = tokenizer.encode(LONG)
    with caplog.at_level(logging.INFO, logger="logicrl.data"):
        loaded = load(tmp_path, [row(SHORT), row(LONG)], tokenizer, max_prompt_length=6, truncation="left")
    assert loaded[0].input_ids == tokenizer.encode(SHORT) and loaded[0].prompt_text == SHORT
    assert loaded[1].input_ids == full[-6:]
    assert loaded[1].prompt_text == ". Oliver is a knave."
    assert loaded.truncated == 1
    assert [r.getMessage() for r in caplog.records] == [
        f"data: cut 1 of 2 prompts in {tmp_path / 'rows.jsonl'} to their last data.max_prompt_length=6 tokens "
        "(data.truncation=left)"]


def test_right_truncation_is_refused_because_it_cuts_where_the_reply_starts(tokenizer, tmp_path):
    # Every prompt ends where the model's turn opens; cutting the end leaves a prompt to continue
    # in the middle of the question (every reward was -1 in the run that found this).
    with pytest.raises(DatasetError, match=r"rows.jsonl row 1: data.truncation=right would cut the end of this "
                                           r"\d+-token prompt, where the assistant's turn opens \(1 of 2 prompts"):
        load(tmp_path, [row(SHORT), row(LONG)], tokenizer, max_prompt_length=6, truncation="right")
    # Nothing is cut, nothing is refused.
    assert len(load(tmp_path, [row(SHORT)], tokenizer, max_prompt_length=6, truncation="right")) == 1


BAD_ROWS = [
    ("missing prompt", {"data_source": "test", **GROUND_TRUTH}, "no 'prompt' (data.prompt_key)"),
    ("prompt of the wrong type", row(42), "'prompt' is int, expected a chat list"),
    ("message that is not a mapping", row(["hi"]), "prompt message 0 is str"),
    ("message without role", row([{"content": "U"}]), "prompt message 0 has no 'role'"),
    ("message without content", row([{"role": "system", "content": "S"}, {"role": "user"}]),
     "prompt message 1 has no 'content'"),
    ("empty chat list", row([]), "prompt is an empty chat list"),
    ("missing reward_model", {"prompt": "p", "data_source": "test"}, "no reward_model.ground_truth"),
    ("missing ground_truth", row("p", reward_model={"style": "rule"}), "no reward_model.ground_truth"),
    ("missing data_source", {"prompt": "p", **GROUND_TRUTH}, "no data_source"),
    ("data_source of the wrong type", row("p", data_source=7), "data_source is int"),
    ("extra_info of the wrong type", row("p", extra_info="x"), "extra_info is str"),
    ("not JSON", "{not json", "not valid JSON"),
]


@pytest.mark.parametrize("record, problem", [case[1:] for case in BAD_ROWS], ids=[case[0] for case in BAD_ROWS])
def test_bad_row_names_file_row_and_fix(tokenizer, tmp_path, record, problem):
    with pytest.raises(DatasetError) as err:
        load(tmp_path, [row("ok"), row("ok"), record], tokenizer)
    message = str(err.value)
    assert message.startswith(f"{tmp_path / 'rows.jsonl'} row 2: {problem}")
    assert "data.skip_bad_rows=true" in message and "\n" not in message


def test_bad_parquet_row_names_its_index(tokenizer, tmp_path):
    path = tmp_path / "rows.parquet"
    pq.write_table(pa.Table.from_pylist([row("ok"), row("p", reward_model=None)]), path)
    with pytest.raises(DatasetError, match=rf"^{path} row 1: no reward_model.ground_truth;"):
        load_prompts(str(path), tokenizer, max_prompt_length=512)


def test_failing_chat_template_is_a_bad_row(cache, tmp_path):
    tok = load_tiny_tokenizer(cache)
    tok.chat_template = "{{ raise_exception('roles must alternate') }}"
    with pytest.raises(DatasetError, match="row 0: the tokenizer's chat template failed .*roles must alternate"):
        load(tmp_path, [row([{"role": "user", "content": "U"}])], tok)


def test_skip_bad_rows_counts_and_logs_once(tokenizer, tmp_path, caplog):
    records = [row("a"), row(42), row("c"), "{oops", row("e")]
    with caplog.at_level(logging.INFO, logger="logicrl.data"):
        loaded = load(tmp_path, records, tokenizer, skip_bad_rows=True)
    assert [r.row_index for r in loaded] == [0, 2, 4]
    assert loaded.bad_rows_skipped == 2
    [record] = caplog.records
    assert record.getMessage().startswith(f"data: skipped 2 bad rows of 5 in {tmp_path / 'rows.jsonl'}")
    assert "first: " in record.getMessage() and "row 1: 'prompt' is int" in record.getMessage()


def test_nothing_left_is_an_error(tokenizer, tmp_path):
    with pytest.raises(DatasetError, match="no prompts left"):
        load(tmp_path, [row(42)], tokenizer, skip_bad_rows=True)
    with pytest.raises(DatasetError, match=r"must end in \.parquet or \.jsonl"):
        load_prompts(str(tmp_path / "rows.csv"), tokenizer, max_prompt_length=8)


def prompt_row(ids, name):
    return PromptRow(ids, f"text {name}", f"source {name}", {"answer": name}, {"i": name}, "f.jsonl", name)


def test_collate_left_pads():
    batch = collate_prompts([prompt_row([5, 6, 7], 0), prompt_row([8, 9], 1), prompt_row([4], 2)], pad_id=0)
    assert batch.batch_size == torch.Size([3])
    assert batch["input_ids"].tolist() == [[5, 6, 7], [0, 8, 9], [0, 0, 4]]
    assert batch["attention_mask"].tolist() == [[1, 1, 1], [0, 1, 1], [0, 0, 1]]
    assert batch["position_ids"].tolist() == [[0, 1, 2], [0, 0, 1], [0, 0, 0]]
    assert batch["data_source"] == ["source 0", "source 1", "source 2"]
    assert batch["ground_truth"] == [{"answer": 0}, {"answer": 1}, {"answer": 2}]
    assert batch["row_index"] == [0, 1, 2]
    # Non-tensor fields stay aligned with the tensors when the batch is indexed or split.
    picked = batch[torch.tensor([2, 0])]
    assert picked["input_ids"].tolist() == [[0, 0, 4], [5, 6, 7]]
    assert picked["prompt_text"] == ["text 2", "text 0"] and picked["extra_info"] == [{"i": 2}, {"i": 0}]
    assert [part["row_index"] for part in batch.split(2)] == [[0, 1], [2]]


def test_the_preflight_sample_is_the_head_and_a_seeded_spread_of_the_rest():
    from logicrl.data.dataset import _sample

    assert _sample(100, None) is None and _sample(100, 100) is None
    picked = _sample(10_000, 10)
    assert picked[:5] == [0, 1, 2, 3, 4] and len(set(picked)) == 10 and picked == sorted(picked)
    assert all(5 <= i < 10_000 for i in picked[5:]) and picked == _sample(10_000, 10)  # seeded


def test_check_rows_reads_a_sample_and_names_a_bad_row(tmp_path):
    from logicrl.data.dataset import check_rows

    path = tmp_path / "rows.jsonl"
    path.write_text("".join(json.dumps(row(f"p{i}")) + "\n" for i in range(50)))
    assert check_rows(str(path), sample=10) == 10
    with pytest.raises(DatasetError, match=rf"{path} row 0: bad truth"):
        check_rows(str(path), row_check=lambda source, truth: "bad truth", sample=10)


def test_batched_tokenization_gives_each_prompt_its_own_encoding_in_file_order(tokenizer, tmp_path, kk_rows,
                                                                                monkeypatch):
    """Prompts are tokenized a chunk at a time (one call per add_special_tokens value): each row's ids are what
    encoding its text alone gives, chat and plain prompts mixed, across a chunk boundary, bad rows in place."""
    import logicrl.data.dataset as dataset

    monkeypatch.setattr(dataset, "ENCODE_BATCH", 4)
    records = []
    for i, chat in enumerate(kk_rows):
        records += [chat, row(f"plain prompt number {i}"), *([row(7)] if i == 2 else [])]
    ds = load(tmp_path, records, tokenizer, skip_bad_rows=True)
    assert ds.bad_rows_skipped == 1 and [r.row_index for r in ds] == [i for i in range(len(records)) if i != 6]
    flags = set()
    for r in ds:
        text, special = render_prompt(r.raw_prompt, tokenizer, r.extra_info)
        flags.add(special)
        assert r.prompt_text == text and r.input_ids == tokenizer.encode(text, add_special_tokens=special), r.row_index
    assert flags == {True, False}
