"""How long the preflight's look at a large data file takes, against loading all of it.

    .venv/bin/python benchmarks/data_check.py [--rows 200000]

Writes a parquet file of `rows` K&K-role rows, then times, in one process: the tokenizer-free row
check a dry run makes (check_rows on SAMPLE_ROWS rows), the real run's check (rendered and
tokenized, load_prompts on the sample), and the trainer's full load, which the preflight must not
be. Compare the ratios; absolute times are noise on a shared machine.
"""

from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq

from logicrl.data.dataset import SAMPLE_ROWS, check_rows, load_prompts
from logicrl.models.loading import load_tokenizer
from logicrl.models.tiny import EMBEDDED_TINY
from logicrl.reward import ground_truth_problem


def write(path: Path, rows: int) -> None:
    table = pa.table({
        "prompt": [[{"role": "user", "content": f"Puzzle {i}: Zoey says Oliver is a knave. Who is Zoey?"}]
                   for i in range(rows)],
        "data_source": ["kk_role"] * rows,
        "reward_model": [{"style": "rule", "ground_truth": {"name": "Zoey", "role": "knight"}}] * rows,
    })
    pq.write_table(table, path)


def timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=200_000)
    args = parser.parse_args()
    tokenizer = load_tokenizer(EMBEDDED_TINY)
    with tempfile.TemporaryDirectory() as tmp:
        path = str(Path(tmp) / "train.parquet")
        write(Path(path), args.rows)
        load = dict(max_prompt_length=1024, row_check=ground_truth_problem)
        shape = timed(lambda: check_rows(path, row_check=ground_truth_problem, sample=SAMPLE_ROWS))
        tokenized = timed(lambda: load_prompts(path, tokenizer, sample=SAMPLE_ROWS, **load))
        full = timed(lambda: load_prompts(path, tokenizer, **load))
    print(f"{args.rows} rows, {SAMPLE_ROWS} checked per file")
    print(f"  dry-run check (rows' shape, rewards):  {shape:6.2f} s")
    print(f"  real-run check (+ render, tokenize):   {tokenized:6.2f} s")
    print(f"  trainer's full load:                   {full:6.2f} s  ({full / tokenized:.0f}x the real-run check)")


if __name__ == "__main__":
    main()
