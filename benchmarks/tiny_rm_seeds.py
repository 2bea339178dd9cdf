"""Does `+recipe=tiny_rm_ppo` learn for every training seed, with reward models built on other machines?

    python benchmarks/tiny_rm_seeds.py --build-seeds 0 1 2 --seeds 1 2 3 4 5 [--launcher /work/wt/heavy] [override ...]

The embedded reward model is not the same bytes on every CPU (models/tiny_rm.py: float sums follow the
instruction set), so other build seeds stand in for other machines, and `--avx2` builds (and runs) with
torch's and MKL's kernels held to AVX2, as on a machine without AVX-512. Each (build, seed) pair is one
60-step launch; the table prints validation accuracy at steps 0, 30 and 60 and the build's held-out agreement,
and every row is appended to --out (JSON lines) as it finishes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

# Environment that holds torch's own kernels (ATen's dispatch) and MKL's to AVX2: a stand-in for the
# 2-core AVX2 machine the recipe stalled on.
AVX2 = {"ATEN_CPU_CAPABILITY": "avx2", "MKL_ENABLE_INSTRUCTIONS": "AVX2", "ONEDNN_MAX_CPU_ISA": "AVX2"}


def build(seed: int, cache: Path, env: dict, launcher: list[str]) -> tuple[Path, float]:
    """The reward model with build seed `seed` under `cache` (in a subprocess: `env` must reach torch before it
    loads), and its held-out agreement."""
    from logicrl.models.tiny_rm import tiny_rm_fingerprint

    built = cache / f"tiny_rm-{tiny_rm_fingerprint(seed)}"
    if (built / "config.json").is_file():  # no slot to wait for when it is cached
        return built, json.loads((built / "tiny_rm_build.json").read_text())["held_out_agreement"]
    code = ("import sys; from logicrl.models.tiny_rm import tiny_rm_checkpoint_dir; "
            f"print(tiny_rm_checkpoint_dir({str(cache)!r}, seed={seed}))")
    out = subprocess.run([*launcher, sys.executable, "-c", code], cwd=ROOT, env=env, check=True,
                         capture_output=True, text=True).stdout
    directory = Path(out.strip().splitlines()[-1])
    return directory, json.loads((directory / "tiny_rm_build.json").read_text())["held_out_agreement"]


def launch(rm: Path, seed: int, run_dir: Path, env: dict, launcher: list[str], overrides: list[str]) -> dict:
    from logicrl.trainer.curves import curve_points

    argv = [*launcher, sys.executable, str(ROOT / "main_ppo.py"), "+recipe=tiny_rm_ppo", f"trainer.seed={seed}",
            f"reward_model.model.path={rm}", "trainer.logger=[jsonl]", "trainer.save_freq=-1",
            f"hydra.run.dir={run_dir}", f"trainer.default_local_dir={run_dir}/ckpt", *overrides]
    start = time.perf_counter()
    result = subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, check=False)
    wall = time.perf_counter() - start
    if result.returncode != 0:
        return {"error": result.stderr[-500:], "wall_s": round(wall, 1)}
    points = curve_points(run_dir)
    val = dict(points["validation accuracy"])
    train = [acc for _, acc in points["train accuracy"]]
    return {"val": {s: val.get(s) for s in (0, 30, 60)}, "train_first10": sum(train[:10]) / 10,
            "train_last10": sum(train[-10:]) / 10, "wall_s": round(wall, 1)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--build-seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[1, 2, 3, 4, 5])
    parser.add_argument("--avx2", action="store_true", help="build and run with kernels held to AVX2")
    parser.add_argument("--launcher", default="", help="a command to prefix each launch with (a slot wrapper)")
    parser.add_argument("--cache", default=str(Path(tempfile.gettempdir()) / "logicrl-rm-seeds"))
    parser.add_argument("--out", default="tiny_rm_seeds.jsonl")
    parser.add_argument("overrides", nargs="*", help="more Hydra overrides for every launch")
    args = parser.parse_args()
    launcher = args.launcher.split()
    env = {**os.environ, "HYDRA_FULL_ERROR": "0", "OMP_NUM_THREADS": "1", **(AVX2 if args.avx2 else {})}
    env["PYTHONPATH"] = os.pathsep.join([str(ROOT), env.get("PYTHONPATH", "")])
    cache = Path(args.cache) / ("avx2" if args.avx2 else "native")
    runs = Path(tempfile.mkdtemp(prefix="logicrl-rm-seeds-"))
    print(f"{'build':>5} {'agree':>6} {'seed':>4}  val@0  val@30  val@60  wall_s", flush=True)
    for build_seed in args.build_seeds:
        rm, agree = build(build_seed, cache, env, launcher)
        for seed in args.seeds:
            row = {"build_seed": build_seed, "avx2": args.avx2, "held_out_agreement": agree, "seed": seed,
                   "overrides": args.overrides,
                   **launch(rm, seed, runs / f"b{build_seed}-s{seed}", env, launcher, args.overrides)}
            with open(args.out, "a") as f:
                f.write(json.dumps(row) + "\n")
            v = row.get("val") or {}
            cells = "  ".join(f"{v[s]:.3f}" if v.get(s) is not None else "  -  " for s in (0, 30, 60))
            print(f"{build_seed:>5} {agree:6.3f} {seed:>4}  {cells}  {row['wall_s']:6.1f}"
                  + (f"  ERROR {row['error'][-200:]}" if "error" in row else ""), flush=True)


if __name__ == "__main__":
    main()
