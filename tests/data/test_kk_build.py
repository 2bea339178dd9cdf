"""The dataset builder and its CLI: verl/Logic-RL schema, disjoint splits, determinism, exit codes."""

import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from logicrl.data.kk.build import build_dataset, build_splits
from logicrl.data.kk.render import render_solution
from logicrl.data.kk.solver import solve
from logicrl.data.kk.statements import from_json

REPO = Path(__file__).resolve().parents[2]
COLUMNS = ["data_source", "prompt", "ability", "reward_model", "extra_info"]


@pytest.fixture(scope="module")
def instruct_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("kk3")
    build_dataset(out, n_people=3, train_size=40, test_size=10, template="qwen-instruct", seed=0)
    return out


def load(out_dir, split):
    return pd.read_parquet(Path(out_dir) / f"{split}.parquet")


def test_parquet_has_the_verl_schema(instruct_dir):
    for split, size in [("train", 40), ("test", 10)]:
        frame = load(instruct_dir, split)
        assert list(frame.columns) == COLUMNS
        assert len(frame) == size
        assert set(frame["data_source"]) == {"kk_logic"}
        assert set(frame["ability"]) == {"logic"}
        for index, row in enumerate(frame.itertuples()):
            assert row.reward_model["style"] == "rule"
            truth = row.reward_model["ground_truth"]
            assert set(truth) == {"solution_text_format", "statements", "think_opened"}
            assert truth["think_opened"] is True
            assert row.extra_info["split"] == split
            assert row.extra_info["index"] == index
            assert [m["role"] for m in row.prompt] == ["system", "user", "assistant"]
            assert row.prompt[-1]["content"] == "<think>"
            assert row.prompt[1]["content"] == row.extra_info["quiz"]


def test_stored_answer_is_the_only_solution(instruct_dir):
    frame = load(instruct_dir, "train")
    for row in frame.itertuples():
        truth, extra = row.reward_model["ground_truth"], row.extra_info
        statements = from_json(truth["statements"])
        solution = tuple(bool(k) for k in extra["solution"])
        assert solve(statements) == [solution]
        assert truth["solution_text_format"] == render_solution(list(extra["names"]), solution)
        assert truth["solution_text_format"].startswith(f"(1) {extra['names'][0]} is a kn")


def test_train_and_test_share_no_puzzle(instruct_dir):
    train, test = load(instruct_dir, "train"), load(instruct_dir, "test")

    def statements(frame):
        return {row.reward_model["ground_truth"]["statements"] for row in frame.itertuples()}

    assert not statements(train) & statements(test)
    assert not {r.extra_info["quiz"] for r in train.itertuples()} & {r.extra_info["quiz"] for r in test.itertuples()}


def test_same_seed_same_bytes_other_seed_other_rows(tmp_path):
    for name, seed in [("a", 3), ("b", 3), ("c", 4)]:
        build_dataset(tmp_path / name, n_people=4, train_size=20, test_size=5, template="base", seed=seed)
    for split in ("train", "test"):
        a, b, c = ((tmp_path / name / f"{split}.parquet").read_bytes() for name in "abc")
        assert a == b
        assert a != c
    assert not load(tmp_path / "a", "train").equals(load(tmp_path / "c", "train"))


def test_test_split_does_not_depend_on_train_size():
    small = build_splits(5, train_size=5, test_size=8, template="qwen-instruct", seed=1)
    large = build_splits(5, train_size=50, test_size=8, template="qwen-instruct", seed=1)
    assert small["test"] == large["test"]


def test_base_template_is_one_user_message_opening_think():
    rows = build_splits(3, train_size=2, test_size=1, template="base")["train"]
    for row in rows:
        (message,) = row["prompt"]
        assert message["role"] == "user"
        assert message["content"].endswith(f"User: {row['extra_info']['quiz']}\nAssistant: <think>")
        assert row["extra_info"]["template"] == "base"
        assert row["reward_model"]["ground_truth"]["think_opened"] is True


@pytest.mark.parametrize(
    "kwargs, key",
    [({"train_size": 0}, "train_size=0"), ({"test_size": -1}, "test_size=-1"), ({"template": "chatml"}, "template")],
)
def test_build_rejects_bad_arguments(kwargs, key):
    args = {"n_people": 3, "train_size": 5, "test_size": 5, "template": "qwen-instruct"} | kwargs
    with pytest.raises(ValueError, match=key):
        build_splits(**args)


def run_cli(*args):
    return subprocess.run(
        [sys.executable, "-m", "logicrl.data.kk", *args], cwd=REPO, capture_output=True, text=True, timeout=120
    )


@pytest.mark.integration
def test_cli_writes_both_files(tmp_path):
    out = tmp_path / "instruct" / "3ppl"
    done = run_cli("--people", "3", "--train-size", "30", "--test-size", "10",
                   "--template", "qwen-instruct", "--out", str(out), "--seed", "0")  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.strip().splitlines()) == 1
    assert str(out) in done.stdout
    assert len(load(out, "train")) == 30 and len(load(out, "test")) == 10
    assert sorted(p.name for p in out.iterdir()) == ["test.parquet", "train.parquet"]


@pytest.mark.parametrize(
    "people, train, test, template, message",
    [
        ("9", "10", "10", "qwen-instruct", "people=9"),
        ("3", "0", "10", "qwen-instruct", "train_size=0"),
        ("3", "10", "-5", "qwen-instruct", "test_size=-5"),
        ("3", "10", "10", "nope", "invalid choice"),
        ("2", "1000", "100", "base", "ask for fewer puzzles"),
    ],
)
def test_cli_bad_arguments_exit_2(tmp_path, capsys, people, train, test, template, message):
    # The CLI's main in this process (its launch: test_cli_writes_both_files); argparse's own refusal
    # exits 2 by SystemExit, the CLI's returns 2.
    from logicrl.data.kk.__main__ import main

    argv = ["--people", people, "--train-size", train, "--test-size", test, "--template", template,
            "--out", str(tmp_path / "out")]
    try:
        code = main(argv)
    except SystemExit as exit_:
        code = exit_.code
    assert code == 2
    assert message in capsys.readouterr().err
    assert not (tmp_path / "out" / "train.parquet").exists()
