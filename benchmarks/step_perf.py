"""What the step-time metrics (logicrl/trainer/step_perf.py) and dynamic sampling's filter cost a step.

    /work/wt/heavy .venv/bin/python benchmarks/step_perf.py --steps 6 [override ...]

Runs main_ppo.py on the embedded default (validation and checkpoints off) for --steps steps and reads the
mean step time (timing_s/step, the first step left out). Then, in this process, times what the metrics add
to a step of the same shape (the step's responses and widths from metrics.jsonl): splitting each round's
response lengths by rank, step_metrics (generation throughput and tails, trainer tokens/s, MFU against a
nominal peak) and, for dynamic sampling, the group filter and its metric. The ratio of the two is the
metrics' share of the step. A large shape (8192 responses of up to 10k tokens, 8 ranks) is timed too,
in absolute terms: a step of that size takes minutes.
"""

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def measured_step(steps: int, overrides: list[str]) -> tuple[float, dict]:
    with tempfile.TemporaryDirectory() as tmp:
        run = [sys.executable, str(ROOT / "main_ppo.py"), f"trainer.total_training_steps={steps}",
               "trainer.logger=[jsonl]", "trainer.val_before_train=false", "trainer.test_freq=-1",
               "trainer.save_freq=-1", f"trainer.default_local_dir={tmp}/ckpt", f"hydra.run.dir={tmp}/run", *overrides]
        subprocess.run(run, check=True, cwd=ROOT, capture_output=True, text=True)
        rows = [json.loads(line) for line in (Path(tmp) / "run/metrics.jsonl").read_text().splitlines()]
    rows = rows[1:] if len(rows) > 2 else rows
    return statistics.mean(r["timing_s/step"] for r in rows), rows[-1]


def metrics_cost(responses: int, width: int, response_width: int, ranks: int, repeats: int) -> float:
    """Seconds per step of the metrics' own work on a batch of this shape (mean over `repeats`)."""
    import torch

    from logicrl.algos.group_filter import groups_with_spread
    from logicrl.models.spec import load_model_spec
    from logicrl.trainer.dynamic_sampling import metric_values
    from logicrl.trainer.step_perf import FlopModel, generation_round, step_metrics

    g = torch.Generator().manual_seed(0)
    response_mask = (torch.arange(response_width) < torch.randint(1, response_width + 1, (responses, 1),
                                                                  generator=g)).long()
    attention_mask = torch.cat([torch.ones(responses, width - response_width, dtype=torch.long), response_mask], 1)
    token_scores = torch.zeros(responses, response_width)
    uid = torch.arange(responses // 8).repeat_interleave(8)
    flops = FlopModel.of(load_model_spec("embedded:tiny"))
    metrics = {"timing_s/generate": 1.0, "timing_s/old_log_prob": 1.0, "timing_s/update_actor": 1.0,
               "perf/worker_timing_s/update_actor": 1.0}
    start = time.perf_counter()
    for _ in range(repeats):
        generated = [generation_round(response_mask, ranks)]
        step_metrics(generated, [1.0] * ranks, metrics, attention_mask, {"update_actor": 1}, flops, True, ranks, 1e15)
        groups_with_spread(uid, metric_values("seq_reward", token_scores, []))
    return (time.perf_counter() - start) / repeats


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=6)
    parser.add_argument("overrides", nargs="*")
    args = parser.parse_args()
    step_s, last = measured_step(args.steps, args.overrides)
    responses = int(last["batch/responses"])
    from omegaconf import OmegaConf

    data = OmegaConf.load(ROOT / "conf/data/default.yaml")
    width = data.max_prompt_length + data.max_response_length
    cost = metrics_cost(responses, width, data.max_response_length, ranks=1, repeats=200)
    print(f"embedded default ({responses} responses, width <= {width}): step {step_s * 1e3:.0f} ms, "
          f"metrics {cost * 1e3:.3f} ms = {100 * cost / step_s:.3f}% of the step")
    big = metrics_cost(8192, 10240, 8192, ranks=8, repeats=3)
    print(f"8192 responses x 10240 tokens, 8 ranks: metrics {big * 1e3:.1f} ms per step")


if __name__ == "__main__":
    main()
