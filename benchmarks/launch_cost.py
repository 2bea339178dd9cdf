"""What one main_ppo.py launch of the test suite costs: wall seconds and the CPU seconds of every process
it starts (the driver, Ray's daemons, Ray's workers, the ranks), by kind, for one or more checkouts.

    .venv/bin/python benchmarks/launch_cost.py [--rounds 2] [--dry] ROOT [ROOT ...]

make test is about 100 such launches on 2 cores, most of them the tiny run of tests/conftest.py
(TINY_RUN on data/kk_role), so a CPU second saved per launch is about a minute of the suite's CPU. Each
ROOT is a checkout (a git worktree: main's and a branch's, say); its main_ppo.py runs with PYTHONPATH set
to it, the roots interleaved round by round so both see the same load. `--dry` also times a dry run
(trainer.dry_run=true: what a config refusal costs, no Ray). CPU is sampled every 0.2 s from the
launch's process tree (Ray's daemons and workers descend from the driver), so a process that lives less
than that is missed. On a shared machine compare roots within one invocation only.
"""

import argparse
import collections
import json
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # then the one tiny run the suite launches, from this checkout's tests
from tests.conftest import TINY_RUN

KINDS = ("gcs_server", "raylet", "dashboard/agent", "runtime_env/agent", "dashboard.py", "log_monitor", "monitor.py",
         "default_worker", "main_ppo")


def kind(proc: psutil.Process) -> str:
    if proc.name().startswith("ray::"):  # a Ray worker names itself by its actor or IDLE
        return proc.name()
    cmd = " ".join(proc.cmdline()) or proc.name()
    return next((k for k in KINDS if k in cmd), cmd[:40])


def launch(root: str, *extra: str) -> dict:
    """One launch of `root`'s main_ppo.py: rc, wall seconds, CPU seconds in all and by process kind."""
    seen: dict[int, tuple[str, float]] = {}
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            for proc in psutil.Process().children(recursive=True):
                try:
                    t = proc.cpu_times()
                    seen[proc.pid] = (kind(proc), t.user + t.system)
                except psutil.Error:
                    pass
            time.sleep(0.2)

    run_dir = tempfile.mkdtemp(prefix="launch-cost-")
    data = Path(root) / "data" / "kk_role"
    argv = [sys.executable, f"{root}/main_ppo.py", *TINY_RUN, f"data.train_files={data}/train.parquet",
            f"data.val_files={data}/test.parquet", f"hydra.run.dir={run_dir}",
            f"trainer.default_local_dir={run_dir}/ckpt", *extra]
    env = {**os.environ, "PYTHONPATH": root, "HYDRA_FULL_ERROR": "0", "OMP_NUM_THREADS": "1"}
    watcher = threading.Thread(target=poll, daemon=True)
    start = time.monotonic()
    watcher.start()
    result = subprocess.run(argv, cwd=root, env=env, capture_output=True, text=True,
                            start_new_session=True, check=False)
    wall = time.monotonic() - start
    done.set()
    watcher.join()
    by, count = collections.Counter(), collections.Counter()
    for name, cpu in seen.values():
        by[name] += cpu
        count[name] += 1
    return {"rc": result.returncode, "wall_s": round(wall, 1), "cpu_s": round(sum(by.values()), 1),
            "by_kind": {k: [round(v, 1), count[k] or 1] for k, v in by.most_common()},
            "error": result.stderr.strip().splitlines()[-1:] if result.returncode else []}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("roots", nargs="+", help="checkouts to compare (each with data/kk_role built)")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--dry", action="store_true", help="also time a dry run (no Ray) per root and round")
    args = parser.parse_args()
    runs: dict[str, list[dict]] = {r: [] for r in args.roots}
    for rnd in range(args.rounds):
        for root in args.roots:
            row = {"round": rnd + 1, "root": root, "run": launch(root)}
            if args.dry:
                row["dry"] = {k: v for k, v in launch(root, "trainer.dry_run=true").items() if k != "by_kind"}
            runs[root].append(row)
            print(json.dumps(row), flush=True)
    print("mean over rounds: root, launch wall s, launch CPU s"
          + (", dry-run wall s, dry-run CPU s" if args.dry else ""))
    for root, rows in runs.items():
        cols = [sum(r["run"][k] for r in rows) / len(rows) for k in ("wall_s", "cpu_s")]
        if args.dry:
            cols += [sum(r["dry"][k] for r in rows) / len(rows) for k in ("wall_s", "cpu_s")]
        print(root, " ".join(f"{c:.1f}" for c in cols))


if __name__ == "__main__":
    main()
