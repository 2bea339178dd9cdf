"""Two private Ray clusters started at the same moment on one machine, many times: do all start?

    .venv/bin/python benchmarks/concurrent_starts.py [--pairs 50] [--timeout 180]

Each round starts two processes that wait for the same instant, then each starts a private cluster
the way a launch does (controller/cluster.py ensure_ray: own sessions, loopback, the reaper, retries
on a taken port), checks it answers, and stops it. A round passes when both started (on two
different GCS addresses) and, once both have exited, no process of either cluster is left. Printed:
one line per round, then how many rounds passed, the start attempts that failed on a taken port and
were retried, and the median and slowest start. It takes a launch's Ray start, not a training run:
the start is where two launches race for ports. The figures quoted are in docs/clusters.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]


def child(start_at: float) -> None:
    """One launch's cluster start at `start_at` (time.time()); one JSON line on stdout."""
    import ray

    from logicrl.controller import cluster, private

    real_init, failed = ray.init, []

    def init(**kwargs):
        try:
            return real_init(**kwargs)
        except Exception as err:
            failed.append(private.port_in_use(str(err)))
            raise

    ray.init = init
    time.sleep(max(0.0, start_at - time.time()))
    began = time.monotonic()
    try:
        cluster.ensure_ray(1, 1, False)
        seconds = time.monotonic() - began
        address = ray.get_runtime_context().gcs_address
        sessions = sorted({os.getsid(p.pid) for p in psutil.Process().children(recursive=True)} - {os.getsid(0)})
        print(json.dumps({"ok": True, "s": seconds, "gcs": address, "retried": failed, "sessions": sessions}),
              flush=True)
    except BaseException as err:  # reported, not raised: the parent counts it
        print(json.dumps({"ok": False, "error": " ".join(str(err).split())[:300], "retried": failed}), flush=True)
    finally:
        cluster.stop_ray()


def alive_in(sessions: set[int]) -> list[int]:
    left = []
    for proc in psutil.process_iter(["status"]):
        try:
            if proc.info["status"] != psutil.STATUS_ZOMBIE and os.getsid(proc.pid) in sessions:
                left.append(proc.pid)
        except (OSError, psutil.Error):
            pass
    return left


def one_round(timeout: float) -> dict:
    start_at = time.time() + 3  # both interpreters have imported Ray by then
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_USAGE_STATS_ENABLED": "0"}
    procs = [subprocess.Popen([sys.executable, __file__, "--child", str(start_at)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.DEVNULL, text=True, start_new_session=True) for _ in range(2)]
    results = []
    for proc in procs:
        try:
            out, _ = proc.communicate(timeout=timeout)
            lines = [line for line in out.splitlines() if line.startswith("{")]
            results.append(json.loads(lines[-1]) if lines else {"ok": False, "error": f"exit {proc.returncode}"})
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            results.append({"ok": False, "error": f"no start within {timeout:.0f} s"})
    sessions = {s for r in results for s in r.get("sessions", [])}
    deadline = time.monotonic() + 10
    while (left := alive_in(sessions)) and time.monotonic() < deadline:
        time.sleep(0.2)
    both = all(r["ok"] for r in results) and results[0]["gcs"] != results[1]["gcs"]
    return {"passed": both and not left, "results": results, "left": left}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=50)
    parser.add_argument("--timeout", type=float, default=180)
    parser.add_argument("--child", type=float, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child is not None:
        child(args.child)
        return
    passed, retried, seconds = 0, 0, []
    for n in range(1, args.pairs + 1):
        result = one_round(args.timeout)
        passed += result["passed"]
        retried += sum(len(r.get("retried", [])) for r in result["results"])
        seconds += [r["s"] for r in result["results"] if r["ok"]]
        said = "; ".join(f"{r['gcs']} in {r['s']:.1f} s" if r["ok"] else f"FAILED: {r['error']}"
                         for r in result["results"])
        left = f"; LEFT {result['left']}" if result["left"] else ""
        print(f"round {n}: {'ok' if result['passed'] else 'FAILED'}: {said}{left}", flush=True)
    print(f"{passed} of {args.pairs} rounds: both clusters started and nothing was left; {retried} start attempts "
          f"failed on a taken port and were retried; start median {statistics.median(seconds or [0]):.1f} s, "
          f"slowest {max(seconds or [0]):.1f} s")


if __name__ == "__main__":
    main()
