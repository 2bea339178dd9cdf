"""The time plan against the clock: predicted vs measured seconds per step for `make train` (the embedded
default) and the four-model PPO recipe (recipes/tiny_rm_ppo.yaml), on this machine after its calibration.

    .venv/bin/python benchmarks/time_plan.py [--steps 8] [override ...]

Each case runs main_ppo.py as a user would (validation and saving off), reads the `time plan: N s/step` line it
printed before training and the median measured step (metrics.jsonl, the first step left out), and prints the
run's own closing table (planned vs measured per phase) and one summary table. Before each case the CPU
calibration is measured again, so a shared machine's load at the time is in the plan. Exit code 1 when a
case is off by more than TARGET.
"""

import argparse
import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from logicrl.timeplan.calibrate import cpu_rates  # noqa: E402
from logicrl.timeplan.report import cpu_threads, measured_phases  # noqa: E402

TARGET = 1.5
CASES = {"make train (embedded default)": [], "tiny_rm_ppo (actor, critic, ref, reward model)": ["+recipe=tiny_rm_ppo"]}
QUIET = ["trainer.test_freq=-1", "trainer.val_before_train=false", "trainer.save_freq=-1", "trainer.logger=[jsonl]"]


def run_case(overrides: list[str], steps: int, tmp: Path) -> tuple[float, float, str]:
    # The machine as it is now: the cached calibration measured again (others' jobs share these cores).
    cpu_rates(cpu_threads(1), fresh=True)
    argv = [sys.executable, str(ROOT / "main_ppo.py"), *overrides, *QUIET, f"trainer.total_training_steps={steps}",
            f"hydra.run.dir={tmp / 'run'}", f"trainer.default_local_dir={tmp / 'ckpt'}"]
    out = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, check=False)
    if out.returncode:
        sys.exit(f"{' '.join(overrides) or 'the default'} failed ({out.returncode}):\n{out.stderr[-3000:]}")
    planned = float(re.search(r"^time plan: ([0-9.e+-]+) s/step", out.stdout, re.M).group(1))
    measured, _ = measured_phases(tmp / "run")
    closing = out.stdout[out.stdout.find("time per step (s)"):]
    return planned, measured["step"], closing


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--out", type=Path, help="keep each case's run directory under OUT (default: deleted)")
    args, extra = parser.parse_known_args()
    rows = []
    for i, (name, overrides) in enumerate(CASES.items()):
        with tempfile.TemporaryDirectory(prefix="time-plan-") as tmp:
            where = args.out / f"case{i}" if args.out else Path(tmp)
            planned, measured, closing = run_case([*overrides, *extra], args.steps, where)
        print(f"== {name}\n{closing}")
        rows.append((name, planned, measured, measured / planned))
    print(f"load average {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")
    print(f"| case | planned s/step | measured s/step (median) | measured / planned | within {TARGET}x |")
    print("|---|---|---|---|---|")
    for name, planned, measured, ratio in rows:
        within = "yes" if 1 / TARGET <= ratio <= TARGET else "NO"
        print(f"| {name} | {planned:.3f} | {measured:.3f} | {ratio:.2f} | {within} |")
    return 0 if all(1 / TARGET <= r <= TARGET for *_, r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
