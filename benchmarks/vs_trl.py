"""TRL's GRPOTrainer against logicrl, in one run, step by step in turn, on the same work.

    make bench-env                                    # TRL into .venv-bench, the main .venv untouched
    .venv/bin/python benchmarks/vs_trl.py --steps 3   # 1 warm-up + 3 timed steps each, alternating
    .venv/bin/python benchmarks/vs_trl.py --steps 3 --engine hf

Both sides: step_time.py's 27M-parameter Qwen2 (random weights, fp32, CPU), the kk_role prompts, 8
prompts x 8 samples x up to 128 tokens at temperature 1, the same optimizer, clip, loss, micro-batches
of 16 rows, one optimizer step per step, the same rule reward and torch threads. logicrl: PPOTrainer's
real step, one rank in this process (tests/gpu/runs.py), vLLM (or --engine hf) generating. TRL:
GRPOTrainer in a subprocess of .venv-bench's Python, which sees the main environment's torch and
transformers through a .pth file, generating with HF as TRL does without a vLLM server. The subprocess
waits for a "go" before each step, so the two never run at once and the machine's load falls on both
alike; a step's time is from its "go" to its end.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCH_PY = ROOT / ".venv-bench/bin/python"
ARR = "actor_rollout_ref"
PROMPTS, N, RESPONSE_LEN, MICRO, LR = 8, 8, 128, 16, 5e-4
TAG = "VS_TRL_STEP"  # the child's protocol lines on stdout; anything else there is ignored


# ---------------------------------------------------------------- TRL's side (runs in .venv-bench)
def trl_child(model_dir: str, data: str, steps: int, threads: int, log_dir: str, prompts: int, length: int) -> None:
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
    from trl import GRPOConfig, GRPOTrainer

    from logicrl.reward import compute_score

    torch.set_num_threads(threads)
    rows = _rows(data, prompts * steps)
    dataset = Dataset.from_list([{"prompt": list(r["prompt"]), "data_source": r["data_source"],
                                  "ground_truth": r["reward_model"]["ground_truth"]} for r in rows])

    def rule_reward(prompts, completions, data_source, ground_truth, **_):
        texts = [c[-1]["content"] if isinstance(c, list) else c for c in completions]
        return [float(compute_score(s, t, g)["score"]) for s, t, g in zip(data_source, texts, ground_truth)]

    class Turns(TrainerCallback):
        """Report each step's time, then wait for the parent's go before the next step."""

        def on_train_begin(self, *_args, **_kw):
            self.start = time.perf_counter()

        def on_step_end(self, *_args, **_kw):
            print(f"{TAG} {time.perf_counter() - self.start:.4f}", flush=True)
            if sys.stdin.readline().strip() != "go":
                sys.exit(0)
            self.start = time.perf_counter()

    config = GRPOConfig(
        output_dir=log_dir, max_steps=steps, per_device_train_batch_size=MICRO,
        # 64 completions generated at once, trained as 4 micro-batches of 16, one optimizer step.
        gradient_accumulation_steps=prompts * N // MICRO, steps_per_generation=prompts * N // MICRO,
        num_generations=N, max_completion_length=length, temperature=1.0, top_p=1.0,
        learning_rate=LR, lr_scheduler_type="constant", warmup_steps=0, weight_decay=0.01, max_grad_norm=1.0,
        beta=0.0, epsilon=0.2, loss_type="dapo", use_cpu=True, bf16=False, fp16=False, logging_steps=1,
        save_strategy="no", report_to=[], seed=0, shuffle_dataset=False, dataloader_num_workers=0)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(model_dir, padding_side="left")
    GRPOTrainer(model=model, reward_funcs=rule_reward, args=config, train_dataset=dataset,
                processing_class=tokenizer, callbacks=[Turns()]).train()


def _rows(path: str, count: int) -> list[dict]:
    import pyarrow.parquet as pq

    table = pq.read_table(path).slice(0, count)
    if table.num_rows < count:
        raise SystemExit(f"{path} has {table.num_rows} prompts; {count} are needed (steps x prompts)")
    return table.to_pylist()


# ---------------------------------------------------------------- logicrl's side (this process)
def logicrl_trainer(model_dir: Path, data: Path, steps: int, engine: str, root: Path, prompts: int, length: int):
    from logicrl.config import compose, validate
    from logicrl.preflight.memory import check_memory
    from logicrl.trainer.ppo import PPOTrainer
    from tests.gpu.local_group import LocalGroup

    cfg, spec, plan = validate(compose([
        f"{ARR}.model.path={model_dir}", f"data.train_files={data}", f"data.val_files={data}",
        "data.shuffle=false", f"data.train_batch_size={prompts}", f"{ARR}.rollout.n={N}",
        f"{ARR}.actor.ppo_mini_batch_size={prompts}", f"{ARR}.actor.ppo_micro_batch_size_per_gpu={MICRO}",
        f"data.max_response_length={length}", f"{ARR}.rollout.max_num_seqs={prompts * N}",
        f"{ARR}.rollout.name={engine}", f"{ARR}.actor.optim.lr={LR}", f"{ARR}.actor.use_kl_loss=false",
        "algorithm.use_kl_in_reward=false", f"trainer.total_training_steps={steps}", "trainer.device=cpu",
        "trainer.val_before_train=false", "trainer.test_freq=-1", "trainer.save_freq=-1",
        "trainer.logger=[jsonl]", f"trainer.default_local_dir={root / 'ckpt'}"]))
    plan = check_memory(cfg, spec, plan).plan
    return PPOTrainer(cfg, plan, root / "run", group_cls=LocalGroup)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=3, help="timed steps each, after one warm-up step")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--engine", default="vllm", help="logicrl's rollout engine: vllm or hf")
    parser.add_argument("--prompts", type=int, default=PROMPTS, help="prompts per step (x8 samples; a multiple of 2)")
    parser.add_argument("--response-len", type=int, default=RESPONSE_LEN, help="max sampled tokens")
    parser.add_argument("--trl-child", nargs=4, metavar=("MODEL", "DATA", "STEPS", "LOG_DIR"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    sys.path.insert(0, str(ROOT))
    if args.trl_child:
        model_dir, data, steps, log_dir = args.trl_child
        trl_child(model_dir, data, int(steps), args.threads, log_dir, args.prompts, args.response_len)
        return
    if not BENCH_PY.is_file():
        sys.exit(f"{BENCH_PY} is missing: run `make bench-env` (installs TRL, the bench extra, into .venv-bench)")
    import torch

    from benchmarks.step_time import bench_model_dir

    model_dir, data = bench_model_dir(), ROOT / "data/kk_role/train.parquet"
    if not data.is_file():
        sys.exit("data/kk_role is missing: run `make data`")
    total = args.steps + 1
    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "PYTHONPATH": str(ROOT), "TOKENIZERS_PARALLELISM": "false"}
        log = Path(tmp) / "trl.log"
        child = subprocess.Popen([str(BENCH_PY), __file__, "--threads", str(args.threads), "--prompts",
                                  str(args.prompts), "--response-len", str(args.response_len), "--trl-child",
                                  str(model_dir), str(data), str(total), tmp], env=env, cwd=ROOT,
                                 stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log.open("w"), text=True)

        def trl_step() -> float:
            for line in child.stdout:
                if line.startswith(TAG):
                    return float(line.split()[1])
            sys.exit(f"TRL's GRPOTrainer ended before its step (exit {child.wait()}); its log:\n"
                     + log.read_text()[-3000:])

        trainer = logicrl_trainer(model_dir, data, total, args.engine, Path(tmp), args.prompts, args.response_len)
        torch.set_num_threads(args.threads)
        times = {"logicrl": [], "trl": []}
        try:
            for step in range(1, total + 1):
                if step > 1:
                    child.stdin.write("go\n")
                    child.stdin.flush()
                t_trl = trl_step()
                start = time.perf_counter()
                metrics = trainer.step(step)
                t_logicrl = time.perf_counter() - start
                warm = " (warm-up)" if step == 1 else ""
                print(f"step {step}{warm}  TRL {t_trl:7.2f} s   logicrl {t_logicrl:7.2f} s "
                      f"(generate {metrics.get('timing_s/generate', float('nan')):.2f} s, update_actor "
                      f"{metrics.get('timing_s/update_actor', float('nan')):.2f} s, mean response "
                      f"{metrics.get('response_length/mean', float('nan')):.0f} tokens)", flush=True)
                if step > 1:
                    times["trl"].append(t_trl)
                    times["logicrl"].append(t_logicrl)
        finally:
            trainer.workers.shutdown()
            child.stdin.close()
            child.wait(timeout=120)
    ratios = [a / b for a, b in zip(times["logicrl"], times["trl"])]
    print(f"logicrl / TRL per step: {' '.join(f'{r:.2f}' for r in ratios)}; median {statistics.median(ratios):.2f} "
          f"(logicrl {statistics.median(times['logicrl']):.2f} s, TRL {statistics.median(times['trl']):.2f} s); "
          f"{args.prompts} prompts x {N} x {args.response_len} tokens, {args.threads} threads, engine {args.engine}, "
          f"load {os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
