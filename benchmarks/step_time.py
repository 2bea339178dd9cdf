"""N training steps on a named configuration: time and peak memory per phase, rollout tokens/s;
with --engines, the same run once per rollout engine and how they compare.

    .venv/bin/python benchmarks/step_time.py --steps 10 [override ...]
    .venv/bin/python benchmarks/step_time.py --engines vllm,hf --bench-model --steps 4   # vLLM vs HF
    python3 benchmarks/step_time.py --in-process --qwen05b --steps 3 trainer.device=cuda \
        actor_rollout_ref.rollout.name=hf

It runs main_ppo.py as a user would (validation off) and summarises metrics.jsonl: each phase's mean
controller time (timing_s/*), the largest per-phase tensor peak any rank reported (perf/memory/*/tensor_peak_gb), and
rollout tokens/s; the first step is left out of the means when there are more than two. --in-process:
one rank without Ray (tests/gpu/runs.py). --qwen05b: a Qwen2.5-0.5B shape with random weights.
--bench-model: a 27M-parameter Qwen2 (BENCH_MODEL, head_dim 64 as vLLM's CPU attention needs) on
4 prompts x 4 responses of up to 128 tokens (BENCH_RUN); random weights rarely sample EOS, so ~94% of
responses run the full 128 tokens, and the table reports the mean length generated.
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ARR = "actor_rollout_ref"
BENCH_MODEL = dict(hidden_size=512, num_hidden_layers=8, num_attention_heads=8, num_key_value_heads=8, head_dim=64,
                   intermediate_size=1408)
BENCH_RUN = ["data.train_batch_size=4", f"{ARR}.rollout.n=4", f"{ARR}.actor.ppo_mini_batch_size=4",
             f"{ARR}.actor.ppo_micro_batch_size_per_gpu=4", f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu=16",
             "data.max_response_length=128", f"{ARR}.rollout.max_num_seqs=16"]


def bench_model_dir() -> Path:
    """The --bench-model checkpoint (config.json, seeded random weights, the tiny tokenizer), built once."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2Config

    from logicrl.models.loading import checkpoint_dir
    from logicrl.models.tiny import TINY_CONFIG, cache_root

    directory = cache_root() / "bench-27m"
    if (directory / "config.json").is_file():
        return directory
    config = {k: v for k, v in TINY_CONFIG.items() if k not in ("model_type", "architectures")}
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(Qwen2Config(**{**config, **BENCH_MODEL}), dtype=torch.float32)
    with tempfile.TemporaryDirectory(dir=directory.parent) as tmp:
        model.save_pretrained(tmp)
        AutoTokenizer.from_pretrained(checkpoint_dir("embedded:tiny")).save_pretrained(tmp)
        Path(tmp).rename(directory)  # whole or absent: a failed build is not mistaken for a checkpoint
    return directory


def run(steps: int, overrides: list[str]) -> list[dict]:
    with tempfile.TemporaryDirectory() as tmp:
        run_dir = Path(tmp) / "run"
        # Checkpoints in the run's own directory: with resume_mode=auto a run would otherwise resume
        # from the previous run's final checkpoint (e.g. the hf run from the vllm run's) and time nothing.
        cmd = [sys.executable, str(ROOT / "main_ppo.py"), f"trainer.total_training_steps={steps}",
               "trainer.logger=[jsonl]", "trainer.val_before_train=false", "trainer.test_freq=-1",
               f"trainer.default_local_dir={Path(tmp) / 'checkpoints'}", *overrides, f"hydra.run.dir={run_dir}"]
        subprocess.run(cmd, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def run_in_process(steps: int, overrides: list[str]) -> list[dict]:
    from tests.gpu.runs import train

    with tempfile.TemporaryDirectory() as tmp:
        return train([f"trainer.total_training_steps={steps}", "trainer.val_before_train=false", "trainer.test_freq=-1",
                      "trainer.save_freq=-1", *overrides], Path(tmp))


def summarize(rows: list[dict], label: str) -> dict[str, float]:
    steady = rows[1:] if len(rows) > 2 else rows
    print(f"{len(rows)} steps ({len(steady)} averaged); {label}")
    phases = sorted({k.split("/", 1)[1] for r in rows for k in r if k.startswith("timing_s/")})
    print(f"{'phase':<16}{'mean s':>10}{'tensor GB':>10}")
    for phase in phases:
        times = [r[f"timing_s/{phase}"] for r in steady if f"timing_s/{phase}" in r]
        peaks = [r[f"perf/memory/{phase}/tensor_peak_gb"] for r in rows if f"perf/memory/{phase}/tensor_peak_gb" in r]
        peak = f"{max(peaks):.3f}" if peaks else "-"
        print(f"{phase:<16}{statistics.mean(times):>10.3f}{peak:>10}")

    def mean(key):
        values = [r[key] for r in steady if key in r]
        return statistics.mean(values) if values else float("nan")

    summary = {"generate s": mean("timing_s/generate"), "tokens/s": mean("perf/rollout_tokens_per_s"),
               "update_weights s": mean("timing_s/update_weights"), "step s": mean("timing_s/step"),
               "response len": mean("response_length/mean")}
    print(f"rollout tokens/s: {summary['tokens/s']:.0f}; mean response length {summary['response len']:.1f}\n")
    return summary


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--engines", default="", help="comma-separated rollout engines to compare, e.g. vllm,hf")
    parser.add_argument("--bench-model", action="store_true", help="the 27M-parameter model and BENCH_RUN batch")
    parser.add_argument("--qwen05b", action="store_true", help="a Qwen2.5-0.5B-shaped model with random weights")
    parser.add_argument("--in-process", action="store_true", help="one rank in this process, no Ray")
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    overrides = list(args.overrides)
    sys.path.insert(0, str(ROOT))  # tests.gpu.runs, for the next two
    runner = run_in_process if args.in_process else run
    if args.qwen05b:
        from logicrl.models.tiny import cache_root
        from tests.gpu.runs import QWEN25_05B, write_random_model

        overrides = [f"{ARR}.model.path={write_random_model(QWEN25_05B, cache_root() / 'qwen2.5-0.5b-random')}",
                     *overrides]
    if args.bench_model:
        overrides = [f"{ARR}.model.path={bench_model_dir()}", *BENCH_RUN, *overrides]
    engines = [e for e in args.engines.split(",") if e]
    if not engines:
        summarize(runner(args.steps, overrides), f"overrides: {' '.join(overrides) or '(embedded default)'}")
        return
    print(f"overrides: {' '.join(overrides)}\n")
    results = {e: summarize(runner(args.steps, [*overrides, f"{ARR}.rollout.name={e}"]), f"rollout.name={e}")
               for e in engines}
    keys = list(next(iter(results.values())))
    print(f"{'engine':<8}" + "".join(f"{k:>18}" for k in keys))
    for engine, summary in results.items():
        print(f"{engine:<8}" + "".join(f"{summary[k]:>18.3f}" for k in keys))
    first, *others = engines
    for other in others:
        ratios = "  ".join(f"{k} x{results[first][k] / results[other][k]:.2f}" for k in keys[:4])
        print(f"{first}/{other}: {ratios}")


if __name__ == "__main__":
    main()
