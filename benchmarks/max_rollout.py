"""The largest rollout.n that trains on one device at a response length, padded against packed
(use_remove_padding): the planner's answer, then one real training step at it, measured against
the plan phase by phase.

    python3 benchmarks/max_rollout.py --shape qwen2.5-1.5b --response-length 1024 trainer.device=cuda
    .venv/bin/python benchmarks/max_rollout.py --shape tiny --response-length 64 --max-n 64   # CPU check

For each mode the planner bisects rollout.n (2 to --max-n) with trainer.auto_micro_batch=true; one GRPO
step with a KL loss then trains at the largest n that fits, on one in-process rank with the HF engine
(tests/gpu/runs.py), each phase's measured peak beside the plan's. Random weights rarely sample EOS, so
responses run to the full length, the case the planner guards against. --no-run plans only; --n trains
at that n. The comparison means something on CUDA only: on CPU the measured peaks are the sampled
process RSS (logicrl/memory/telemetry.py), a check that the step runs, not of the plan.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))  # a script: find logicrl from any directory

from logicrl.config.phases import ARR

MODES = {"padded": "false", "packed": "true"}


def model_path(shape: str) -> str:
    if shape == "tiny":
        return "embedded:tiny"
    from logicrl.models.tiny import cache_root
    from tests.gpu.runs import write_random_model

    config = json.loads((ROOT / "logicrl/memory/shapes" / shape / "config.json").read_text())
    config.pop("torch_dtype", None)
    return str(write_random_model(config, cache_root() / f"{shape}-random"))


def overrides(args, path: str, packed: str, n: int, data: list[str]) -> list[str]:
    p = args.prompts
    return [*data, f"{ARR}.model.path={path}", "algorithm.adv_estimator=grpo", f"{ARR}.actor.use_kl_loss=true",
            f"data.train_batch_size={p}", f"{ARR}.actor.ppo_mini_batch_size={p}", f"{ARR}.rollout.n={n}",
            f"{ARR}.rollout.name=hf", f"data.max_prompt_length={args.prompt_length}",
            f"data.max_response_length={args.response_length}", f"{ARR}.model.use_remove_padding={packed}",
            f"{ARR}.model.enable_gradient_checkpointing=true", "trainer.auto_micro_batch=true",
            # 1 divides any mini-batch; auto_micro_batch raises each to the largest that fits
            f"{ARR}.actor.ppo_micro_batch_size_per_gpu=1", f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu=1",
            f"{ARR}.ref.log_prob_micro_batch_size_per_gpu=1", *args.overrides]


def plan(over: list[str]):
    """(the step plan the preflight returns, its memory plan) or None when it does not fit."""
    from logicrl.config import ConfigError, compose, validate
    from logicrl.preflight.memory import check_memory

    cfg, spec, step_plan = validate(compose(over))
    try:
        planned = check_memory(cfg, spec, step_plan)
    except ConfigError:
        return None
    return planned.plan, planned.memory


def largest_n(fits, top: int) -> int:
    """The largest n in [2, top] with fits(n) (GRPO needs two responses a prompt), for a fits that
    holds up to some n and not after; 0 if none."""
    if not fits(2):
        return 0
    lo, hi = 2, top + 1
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if fits(mid) else (lo, mid)
    return lo


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", default="qwen2.5-1.5b", help="a directory of logicrl/memory/shapes, or tiny")
    parser.add_argument("--response-length", type=int, default=1024)
    parser.add_argument("--prompt-length", type=int, default=256)
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-n", type=int, default=512)
    parser.add_argument("--modes", default="padded,packed")
    parser.add_argument("--no-run", action="store_true", help="plan only")
    parser.add_argument("--n", type=int, default=0, help="train at this rollout.n instead of the largest")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()

    from logicrl.memory.phases import GB
    from tests.conftest import write_jsonl
    from tests.gpu.runs import train

    path = model_path(args.shape)
    work = Path(tempfile.mkdtemp(prefix="max-rollout-"))
    data = [f"data.train_files={write_jsonl(work / 'train.jsonl', 16)}",
            f"data.val_files={write_jsonl(work / 'test.jsonl', 4)}"]
    print(f"shape {args.shape}, {args.prompts} prompts, response length {args.response_length}, "
          f"overrides {' '.join(args.overrides) or '-'}")
    for mode in args.modes.split(","):
        packed = MODES[mode]
        if args.n:
            n = args.n
            print(f"\n== {mode}: rollout.n={n} (--n) = {n * args.prompts} responses x {args.response_length} tokens")
        else:
            n = largest_n(lambda k, packed=packed: plan(overrides(args, path, packed, k, data)) is not None, args.max_n)
            print(f"\n== {mode}: largest rollout.n the plan fits: {n}"
                  f"{' (the --max-n cap)' if n == args.max_n else ''} = {n * args.prompts} responses x "
                  f"{args.response_length} tokens")
        if n == 0 or args.no_run:
            continue
        over = overrides(args, path, packed, n, data)
        step_plan, memory = plan(over)
        skipped = {p.name for p in memory.phases if p.skipped}
        picked = {p.name: p.micro.describe() for p in step_plan.phases if p.micro is not None and p.name not in skipped}
        print(f"micro-batches: {picked}")
        start = time.monotonic()
        rows = train([*over, "trainer.total_training_steps=1", "trainer.val_before_train=false",
                      "trainer.test_freq=-1", "trainer.save_freq=-1"], work / mode)
        print(f"one step trained in {time.monotonic() - start:.1f} s (model load included); response length mean "
              f"{rows[-1].get('response_length/mean', float('nan')):.0f}")
        print(f"{'phase':<16}{'planned GB':>12}{'measured GB':>13}{'measured/planned':>18}")
        for phase in memory.phases:
            measured = rows[-1].get(f"perf/memory/{phase.name}/tensor_peak_gb")
            if phase.skipped or measured is None:
                continue
            planned = phase.total / GB
            print(f"{phase.name:<16}{planned:>12.3f}{measured:>13.3f}{measured / planned:>18.3f}")


if __name__ == "__main__":
    main()
