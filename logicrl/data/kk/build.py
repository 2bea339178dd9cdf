"""K&K dataset rows in the verl / Logic-RL schema, and the parquet files that hold them.

    data_source   "kk_logic"
    prompt        [{"role", "content"}, ...]   (see templates.py for each template's shape)
    ability       "logic"
    reward_model  {"style": "rule",
                   "ground_truth": {"solution_text_format": "(1) Zoey is a knight\\n(2) ...",
                                    "statements": <JSON of the statement trees>,
                                    "think_opened": <the prompt already opened <think>>}}
    extra_info    {"split", "index", "template", "n_people", "names", "solution", "quiz"}

`ground_truth` holds what the reward reads; the rest a reader may want lives in `extra_info`. The test
split is drawn first, then the train split, from one stream and one set of seen puzzles: the splits
never share a puzzle, even under other names (puzzles are deduplicated by their statement trees), and
a seed's test set stays the same whatever `train_size` is.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from logicrl.data.kk.generator import Puzzle, check_shape, generate_puzzles
from logicrl.data.kk.render import render_puzzle, render_solution, sample_names
from logicrl.data.kk.statements import to_json
from logicrl.data.kk.templates import THINK_OPENED, apply_template

DATA_SOURCE = "kk_logic"
ABILITY = "logic"
SPLITS = ("test", "train")  # generation order; see module docstring

_MESSAGE = pa.struct([("role", pa.string()), ("content", pa.string())])
SCHEMA = pa.schema(
    [
        ("data_source", pa.string()),
        ("prompt", pa.list_(_MESSAGE)),
        ("ability", pa.string()),
        (
            "reward_model",
            pa.struct(
                [
                    ("style", pa.string()),
                    (
                        "ground_truth",
                        pa.struct(
                            [
                                ("solution_text_format", pa.string()),
                                ("statements", pa.string()),
                                ("think_opened", pa.bool_()),
                            ]
                        ),
                    ),
                ]
            ),
        ),
        (
            "extra_info",
            pa.struct(
                [
                    ("split", pa.string()),
                    ("index", pa.int64()),
                    ("template", pa.string()),
                    ("n_people", pa.int64()),
                    ("names", pa.list_(pa.string())),
                    ("solution", pa.list_(pa.bool_())),
                    ("quiz", pa.string()),
                ]
            ),
        ),
    ]
)


def make_row(puzzle: Puzzle, split: str, index: int, template: str, text_rng: np.random.Generator) -> dict:
    names = sample_names(text_rng, puzzle.n_people)
    quiz = render_puzzle(puzzle, names, text_rng)
    return {
        "data_source": DATA_SOURCE,
        "prompt": apply_template(template, quiz),
        "ability": ABILITY,
        "reward_model": {
            "style": "rule",
            "ground_truth": {
                "solution_text_format": render_solution(names, puzzle.solution),
                "statements": to_json(puzzle.statements),
                "think_opened": THINK_OPENED[template],
            },
        },
        "extra_info": {
            "split": split,
            "index": index,
            "template": template,
            "n_people": puzzle.n_people,
            "names": names,
            "solution": list(puzzle.solution),
            "quiz": quiz,
        },
    }


def build_splits(
    n_people: int,
    train_size: int,
    test_size: int,
    template: str,
    *,
    seed: int = 0,
    depth: int = 2,
    width: int = 2,
) -> dict[str, list[dict]]:
    """{"train": rows, "test": rows}; the same arguments always give the same rows."""
    check_shape(n_people, depth, width)
    apply_template(template, "")  # unknown name -> ValueError before any work
    sizes = {"train": train_size, "test": test_size}
    for split, size in sizes.items():
        if size < 1:
            raise ValueError(f"{split}_size={size} must be at least 1")

    # Separate streams: changing how text is phrased must not change which puzzles are drawn.
    puzzle_rng = np.random.default_rng([seed, 0])
    text_rng = np.random.default_rng([seed, 1])
    seen: set = set()
    rows: dict[str, list[dict]] = {}
    for split in SPLITS:
        puzzles = generate_puzzles(sizes[split], n_people, puzzle_rng, depth=depth, width=width, seen=seen)
        rows[split] = [make_row(p, split, i, template, text_rng) for i, p in enumerate(puzzles)]

    shared = _quizzes(rows["train"]) & _quizzes(rows["test"])
    assert not shared, f"train and test share {len(shared)} puzzles, e.g. {next(iter(shared))!r}"
    return {"train": rows["train"], "test": rows["test"]}


def _quizzes(rows: list[dict]) -> set[str]:
    return {row["extra_info"]["quiz"] for row in rows}


def write_parquet(rows: list[dict], path: str | os.PathLike) -> Path:
    """Write rows with the fixed SCHEMA; the file appears only once complete."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    # `make data` skips sets whose files exist, so an interrupted write must not leave one.
    partial = path.with_name(path.name + ".partial")
    pq.write_table(pa.Table.from_pylist(rows, schema=SCHEMA), partial)
    os.replace(partial, path)
    return path


def build_dataset(out_dir: str | os.PathLike, n_people: int, train_size: int, test_size: int,
                  template: str, *, seed: int = 0, depth: int = 2, width: int = 2) -> dict[str, Path]:
    """Build both splits and write `train.parquet` and `test.parquet` under out_dir."""
    splits = build_splits(n_people, train_size, test_size, template, seed=seed, depth=depth, width=width)
    return {split: write_parquet(rows, Path(out_dir) / f"{split}.parquet") for split, rows in splits.items()}
