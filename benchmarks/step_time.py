"""N training steps on a named configuration: time and peak memory per phase, rollout tokens/s.

    .venv/bin/python benchmarks/step_time.py --steps 10 [override ...]
    .venv/bin/python benchmarks/step_time.py --steps 5 +recipe=stage1 actor_rollout_ref.model.path=/ckpt/...

It runs main_ppo.py as a user would (validation off, JSONL metrics) and summarises its
metrics.jsonl: the mean controller wall time of each phase (timing_s/*, Ray transfers included),
the largest per-phase peak memory any rank reported (perf/memory/*/peak_gb: CUDA max allocated,
or on CPU the sampled process RSS, see logicrl/memory/telemetry.py), and rollout tokens/s. The
first step (worker start-up, caches) is left out of the means when there are more than two.
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        cmd = [sys.executable, str(ROOT / "main_ppo.py"), f"trainer.total_training_steps={args.steps}",
               "trainer.logger=[jsonl]", "trainer.val_before_train=false", "trainer.test_freq=-1",
               *args.overrides, f"hydra.run.dir={run_dir}"]
        subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        rows = [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    steady = rows[1:] if len(rows) > 2 else rows
    print(f"{len(rows)} steps ({len(steady)} averaged); overrides: {' '.join(args.overrides) or '(embedded default)'}")
    phases = sorted({k.split("/", 1)[1] for r in rows for k in r if k.startswith("timing_s/")})
    print(f"{'phase':<16}{'mean s':>10}{'peak GB':>10}")
    for phase in phases:
        times = [r[f"timing_s/{phase}"] for r in steady if f"timing_s/{phase}" in r]
        peaks = [r[f"perf/memory/{phase}/peak_gb"] for r in rows if f"perf/memory/{phase}/peak_gb" in r]
        peak = f"{max(peaks):.3f}" if peaks else "-"
        print(f"{phase:<16}{statistics.mean(times):>10.3f}{peak:>10}")
    print(f"rollout tokens/s: {statistics.mean(r['perf/rollout_tokens_per_s'] for r in steady):.0f}")


if __name__ == "__main__":
    main()
