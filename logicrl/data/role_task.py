"""The embedded default's task: recall a stated role ("kk_role").

A tiny model cannot solve Knights-and-Knaves puzzles, so `make train` needs a task it can learn
on 2 CPU cores in minutes, with a verifiable reward and an unmistakable climb. Each prompt
names a few islanders, states the role of one of them, and opens the assistant turn as
"<Name> is a"; the right continuation is the stated role:

    user:       Knights always tell the truth and knaves always lie. You meet Zoey, Noah and Liam.
                Noah is a knight. Which one is Noah?
    assistant:  Noah is a            <- the prompt ends here; " knight" earns the reward

The model must read the prompt and copy the stated role, so a policy that always says "knight"
scores only half (with every role stated, the tiny model plateaus at 75%). Reward: reward/role.py.

    python -m logicrl.data.role_task --people 3 --train-size 2000 --test-size 200 --out data/kk_role
"""

from __future__ import annotations

import argparse
import re
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from logicrl.data.kk.render import NAMES

DATA_SOURCE = "kk_role"
ROLES = ("knight", "knave")
INTRO = "Knights always tell the truth and knaves always lie."
_WORD = re.compile(r"[a-z]+")


def answer_word(response: str) -> str:
    """The answer a response gives: its first word, lowercased ("" when it has none). The prompt ends
    "<Name> is a", so the word that continues it is the role named. Read by the rule reward
    (reward/role.py) and by the embedded reward model's labels (models/tiny_rm.py): one definition."""
    match = _WORD.search(str(response).lower())
    return match.group(0) if match else ""


def _listing(names: list[str]) -> str:
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + f" and {names[-1]}"


def make_row(names: list[str], role: str, asked: int, split: str, index: int) -> dict:
    who = names[asked]
    return {
        "data_source": DATA_SOURCE,
        "prompt": [{"role": "user",
                    "content": f"{INTRO} You meet {_listing(names)}. {who} is a {role}. Which one is {who}?"},
                   {"role": "assistant", "content": f"{who} is a"}],
        "ability": "recall",
        "reward_model": {"style": "rule", "ground_truth": {"name": who, "role": role}},
        "extra_info": {"split": split, "index": index, "n_people": len(names)},
    }


def generate(people: int, train_size: int, test_size: int, seed: int = 0) -> dict[str, list[dict]]:
    """Train and test rows that never share a (names, role, asked) triple."""
    rng = np.random.default_rng(seed)
    seen: set[tuple] = set()
    splits: dict[str, list[dict]] = {"test": [], "train": []}
    for split, size in (("test", test_size), ("train", train_size)):
        for _ in range(100 * size):
            if len(splits[split]) == size:
                break
            names = [NAMES[i] for i in rng.choice(len(NAMES), size=people, replace=False)]
            role = ROLES[int(rng.integers(0, 2))]
            asked = int(rng.integers(0, people))
            key = (tuple(names), role, asked)
            if key not in seen:
                seen.add(key)
                splits[split].append(make_row(names, role, asked, split, len(splits[split])))
        if len(splits[split]) < size:
            raise ValueError(f"only {len(splits[split])} distinct {split} prompts for {people} people: ask for fewer")
    return splits


def write(splits: dict[str, list[dict]], out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    for split, rows in splits.items():
        pq.write_table(pa.Table.from_pylist(rows), out / f"{split}.parquet")


def run_cli(prog: str, doc: str, source: str, generate_splits, argv: list[str] | None) -> int:
    """The command line shared by the role tasks: sizes and seed in, one parquet per split out."""
    parser = argparse.ArgumentParser(prog=prog, description=doc.splitlines()[0])
    parser.add_argument("--people", type=int, default=3, help="islanders named per prompt (1 to 8)")
    parser.add_argument("--train-size", type=int, default=2000)
    parser.add_argument("--test-size", type=int, default=200)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args(argv)
    if not 1 <= args.people <= 8 or args.train_size < 1 or args.test_size < 1:
        print("error: --people must be 1..8 and the sizes positive", file=sys.stderr)
        return 2
    start = time.perf_counter()
    try:
        splits = generate_splits(args.people, args.train_size, args.test_size, args.seed)
    except ValueError as e:
        print(f"error: {e}", file=sys.stderr)
        return 2
    write(splits, args.out)
    print(f"{source}: {args.train_size} train + {args.test_size} test prompts of {args.people} people "
          f"in {time.perf_counter() - start:.1f}s -> {args.out}")
    return 0


def main(argv: list[str] | None = None) -> int:
    return run_cli("python -m logicrl.data.role_task", __doc__, "kk_role", generate, argv)


if __name__ == "__main__":
    sys.exit(main())
