"""Do two runs' metrics.jsonl agree, timings and memory aside? The check behind a refactor that must change
no result: the same seed before and after gives the same values under the same keys, step by step.

    python benchmarks/same_metrics.py RUN_A/metrics.jsonl RUN_B/metrics.jsonl [--rtol 0]

Keys under timing_s/, perf/ and the wall-clock ones are skipped (they differ run to run); every other key
must be present in both and equal (within --rtol for floats). Exit 0 and one line when they agree; exit 1
and the first differences otherwise.
"""

from __future__ import annotations

import argparse
import json
import math
import sys

SKIPPED = ("timing_s/", "perf/", "time/", "memory/")
WALL = {"elapsed_s", "wall_s", "time", "timestamp"}


def rows(path: str) -> list[dict]:
    with open(path) as f:
        return [json.loads(line) for line in f if line.strip()]


def kept(row: dict) -> dict:
    return {k: v for k, v in row.items() if not k.startswith(SKIPPED) and k not in WALL}


def same(a, b, rtol: float) -> bool:
    if isinstance(a, float) and isinstance(b, float):
        if math.isnan(a) and math.isnan(b):
            return True
        return a == b or abs(a - b) <= rtol * max(abs(a), abs(b))
    return a == b


def differences(a: list[dict], b: list[dict], rtol: float) -> list[str]:
    out = []
    if len(a) != len(b):
        out.append(f"{len(a)} rows against {len(b)}")
    for i, (ra, rb) in enumerate(zip(a, b)):
        ka, kb = kept(ra), kept(rb)
        for key in sorted(ka.keys() | kb.keys()):
            if key not in ka or key not in kb:
                out.append(f"row {i}: {key} only in {'first' if key in ka else 'second'}")
            elif not same(ka[key], kb[key], rtol):
                out.append(f"row {i}: {key} {ka[key]!r} != {kb[key]!r}")
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("first")
    parser.add_argument("second")
    parser.add_argument("--rtol", type=float, default=0.0)
    args = parser.parse_args()
    a, b = rows(args.first), rows(args.second)
    diff = differences(a, b, args.rtol)
    if diff:
        print(f"{len(diff)} differences:", *diff[:40], sep="\n  ")
        return 1
    print(f"same: {len(a)} rows, {len(kept(a[0])) if a else 0} keys a row compared (timings and memory aside)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
