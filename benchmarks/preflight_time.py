"""How long a config error and a dry run take from the command line (target: errors under 3 s).

    .venv/bin/python benchmarks/preflight_time.py [--repeats 5]

Each case runs main_ppo.py in a fresh process, as a user would, and reports the median wall time.
"""

import argparse
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
CASES = {
    "unknown key (before Hydra)": ["actor_rollout_ref.rollout.nn=3"],
    "wrong type (schema merge)": ["data.train_batch_size=abc"],
    "batch arithmetic (cross-field)": ["actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu=5"],
    "missing data file": ["data.train_files=nowhere.parquet"],
    "dry run, embedded default": ["trainer.dry_run=true"],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = Path(tmp) / "train.jsonl"
        truth = '"data_source": "kk_role", "reward_model": {"ground_truth": {"name": "Zoey", "role": "knight"}}'
        data.write_text("".join(f'{{"prompt": "puzzle {i}", {truth}}}\n' for i in range(20)))
        # Every case but the missing file gets valid data, so it fails (or passes) where its name says.
        data_args = [f"data.train_files={data}", f"data.val_files={data}"]
        for name, overrides in CASES.items():
            overrides = overrides if "nowhere" in overrides[0] else data_args + overrides
            times, code = [], None
            for _ in range(args.repeats):
                start = time.perf_counter()
                proc = subprocess.run([sys.executable, str(ROOT / "main_ppo.py"), *overrides],
                                      cwd=tmp, capture_output=True)
                times.append(time.perf_counter() - start)
                code = proc.returncode
            print(f"{name:<34} exit {code}  median {statistics.median(times):.2f}s  max {max(times):.2f}s")


if __name__ == "__main__":
    main()
