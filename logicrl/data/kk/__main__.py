"""Build a K&K train/test pair of parquet files.

    python -m logicrl.data.kk --people 3 --train-size 900 --test-size 100 \
        --template qwen-instruct --out data/kk/instruct/3ppl [--seed 0] [--depth 2 --width 2]

Bad arguments, or asking for more puzzles than exist at that size, exit 2 with one line on stderr.
"""

from __future__ import annotations

import argparse
import sys
import time

from logicrl.data.kk.build import build_dataset
from logicrl.data.kk.generator import PuzzleSpaceExhausted
from logicrl.data.kk.templates import TEMPLATES


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m logicrl.data.kk", description=__doc__.splitlines()[0])
    parser.add_argument("--people", type=int, required=True, help="inhabitants per puzzle, 2 to 8")
    parser.add_argument("--train-size", type=int, required=True, help="puzzles in train.parquet")
    parser.add_argument("--test-size", type=int, required=True, help="puzzles in test.parquet")
    parser.add_argument("--template", required=True, choices=sorted(TEMPLATES), help="prompt template")
    parser.add_argument("--out", required=True, help="directory for train.parquet and test.parquet")
    parser.add_argument("--seed", type=int, default=0, help="same seed, same files")
    parser.add_argument("--depth", type=int, default=2, help="most levels in a statement tree (paper: 2)")
    parser.add_argument("--width", type=int, default=2, help="most operands of one and/or (paper: 2)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    start = time.perf_counter()
    try:
        paths = build_dataset(args.out, args.people, args.train_size, args.test_size, args.template,
                              seed=args.seed, depth=args.depth, width=args.width)
    except (ValueError, PuzzleSpaceExhausted) as err:
        print(f"python -m logicrl.data.kk: error: {err}", file=sys.stderr)
        return 2
    print(f"kk: {args.train_size} train + {args.test_size} test puzzles of {args.people} people "
          f"(template={args.template}, seed={args.seed}, depth={args.depth}, width={args.width}) "
          f"in {time.perf_counter() - start:.1f}s -> {paths['train'].parent}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
