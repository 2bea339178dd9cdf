"""Time K&K puzzle generation (target: 1000 puzzles of 7 people in under 30 s).

    .venv/bin/python benchmarks/kk_generate.py            # 1000 puzzles of 7 people
    .venv/bin/python benchmarks/kk_generate.py --people 3 5 7 8 --count 1000

(needs logicrl importable: the .venv that `make setup` installs it into, or PYTHONPATH=.)

Times the whole path a dataset row takes, not the parquet write: drawing statement trees,
solving each candidate over all 2^N assignments until one has exactly one solution, and
rendering the puzzle, its solution and the prompt.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from logicrl.data.kk.build import make_row
from logicrl.data.kk.generator import generate_puzzles


def time_people(n_people: int, count: int, seed: int, depth: int, width: int) -> tuple[float, float]:
    """(seconds to draw+solve, seconds to render) for `count` puzzles."""
    start = time.perf_counter()
    puzzles = generate_puzzles(count, n_people, np.random.default_rng(seed), depth=depth, width=width)
    generated = time.perf_counter()
    text_rng = np.random.default_rng(seed + 1)
    for i, puzzle in enumerate(puzzles):
        make_row(puzzle, "train", i, "qwen-instruct", text_rng)
    return generated - start, time.perf_counter() - generated


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--people", type=int, nargs="+", default=[7])
    parser.add_argument("--count", type=int, default=1000)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--depth", type=int, default=2)
    parser.add_argument("--width", type=int, default=2)
    args = parser.parse_args()
    for n_people in args.people:
        gen_s, render_s = time_people(n_people, args.count, args.seed, args.depth, args.width)
        total = gen_s + render_s
        print(f"kk_generate people={n_people} count={args.count} depth={args.depth} width={args.width}: "
              f"{total:.2f}s total ({gen_s:.2f}s generate+solve, {render_s:.2f}s render), "
              f"{args.count / total:.0f} puzzles/s")


if __name__ == "__main__":
    main()
