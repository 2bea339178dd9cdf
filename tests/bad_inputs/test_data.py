"""Bad data: every kind is one line naming the file and row, before Ray or a model starts.

One bad row runs the real entry point (exit code, stderr, seconds to fail); the others run its checks
in-process (`check_main`), the same code without a launch.
"""

from __future__ import annotations

import json

import pytest

from tests.bad_inputs.conftest import jsonl, refused, row, small_run, timed_main
from tests.conftest import assert_refused, check_main

BAD_ROWS = {
    # name: (the bad row, what the line must say)
    "row without a prompt": ({"data_source": "kk_role", "reward_model": {"ground_truth": {"role": "knave"}}},
                             "no 'prompt' (data.prompt_key)"),
    "unknown data_source": (row(data_source="knk"), "no rule reward for data_source='knk'"),
    "ground truth of the wrong shape": (row(reward_model={"ground_truth": "knight"}),
                                        "does not fit the 'kk_role' reward"),
    "ground truth no answer can match": (row(reward_model={"ground_truth": {"role": "liar"}}),
                                         "does not fit the 'kk_role' reward"),
    "a line that is not JSON": ("{not json", "not valid JSON"),
    # Before: trained on the literal text, reward -1 from then on.
    "a chat list stored as JSON text": (row(prompt=json.dumps([{"role": "user", "content": "Who is Zoey?"}])),
                                        "prompt is a string holding a JSON chat list"),
    "an empty prompt": (row(prompt=""), "prompt is an empty string"),
}


@pytest.mark.parametrize("case", list(BAD_ROWS))
def test_a_bad_row_is_one_line_naming_file_and_row(tmp_path, case):
    bad, says = BAD_ROWS[case]
    train = jsonl(tmp_path / "train.jsonl", [row(i) for i in range(12)] + [bad])
    assert_refused(check_main(*small_run(tmp_path), f"data.train_files={train}"),
                   "data.train_files", f"{train} row 12", says)


@pytest.mark.integration
def test_a_bad_row_through_the_entry_point_fails_in_seconds(tmp_path):
    bad, says = BAD_ROWS["unknown data_source"]
    train = jsonl(tmp_path / "train.jsonl", [row(i) for i in range(12)] + [bad])
    result, seconds = timed_main(*small_run(tmp_path), f"data.train_files={train}")
    refused(result, seconds, "data.train_files", f"{train} row 12", says)
    # The rows' shape is checked before the tokenizer's import: about a second.
    assert seconds < 15


def test_a_corrupt_parquet_file_is_one_line(tmp_path):
    broken = tmp_path / "train.parquet"
    broken.write_bytes(b"PAR1" + bytes(range(256)) * 2 + b"PAR1")
    result = check_main(*small_run(tmp_path), f"data.train_files={broken}")
    assert_refused(result, str(broken), "cannot be read as parquet")


def test_a_file_that_is_not_utf8_is_one_line(tmp_path):
    latin = tmp_path / "train.jsonl"
    latin.write_bytes(b'{"prompt": "caf\xe9"}\n' * 20)
    result = check_main(*small_run(tmp_path), f"data.train_files={latin}")
    assert_refused(result, str(latin), "is not UTF-8 text")


LONG = [row(i, prompt=[{"role": "user", "content": "Zoey says Oliver is a knave. " * 40}]) for i in range(20)]


def test_over_long_prompts_under_truncation_error_are_refused_in_the_preflight(tmp_path):
    train = jsonl(tmp_path / "long.jsonl", LONG)
    result = check_main(*small_run(tmp_path), f"data.train_files={train}")
    assert_refused(result, f"{train} row 0: prompt is", "more than data.max_prompt_length=",
                   "data.truncation=filter")


def test_truncation_right_is_refused_where_it_would_cut_the_assistant_turn(tmp_path):
    train = jsonl(tmp_path / "long.jsonl", LONG)
    result = check_main(*small_run(tmp_path), f"data.train_files={train}", "data.truncation=right")
    assert_refused(result, f"{train} row 0", "data.truncation=right would cut the end",
                   "where the assistant's turn opens", "data.truncation=left")
