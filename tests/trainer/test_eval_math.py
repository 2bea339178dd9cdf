"""+recipe=eval_math: one command evaluates a model on local math parquets in verl's schema and reports the
accuracy of each data_source; nothing is trained or saved (trainer.val_only)."""

import json

import pandas as pd
import pytest

from logicrl.config.phases import ARR
from logicrl.run_lock import LOCK_FILE
from tests.conftest import read_metrics, run_main, tail

pytestmark = pytest.mark.integration


def test_eval_math_reports_accuracy_per_data_source(tmp_path):
    rows = [("math", "\\frac{1}{2}"), ("math", "[1,3)"), ("gsm8k", "72"), ("lighteval/MATH", "\\sqrt{2}")]
    data = tmp_path / "math.parquet"
    question = "Problem {}: put the answer in \\boxed{{}}."
    pd.DataFrame([{"data_source": source, "prompt": [{"role": "user", "content": question.format(i)}],
                   "reward_model": {"style": "rule", "ground_truth": truth}, "extra_info": {"index": i}}
                  for i, (source, truth) in enumerate(rows)]).to_parquet(data)
    run_dir, ckpt = tmp_path / "run", tmp_path / "ckpt"
    # The embedded model, its short lengths and HF's engine: the recipe's pipeline, not a model's skill.
    result = run_main("+recipe=eval_math", f"data.val_files={data}", "data.max_prompt_length=64",
                      "data.max_response_length=8", f"{ARR}.rollout.name=hf", "data.train_batch_size=4",
                      f"{ARR}.actor.ppo_mini_batch_size=4", f"hydra.run.dir={run_dir}",
                      f"trainer.default_local_dir={ckpt}", cwd=tmp_path)
    assert result.returncode == 0, tail(result)
    # The tiny model writes no \boxed{}: every source is scored, and wrong.
    assert ("logicrl: validation accuracy per data_source: gsm8k 0.000, lighteval/MATH 0.000, math 0.000; all 0.000"
            in result.stdout)
    (metrics,) = read_metrics(run_dir)
    assert metrics["step"] == 0 and {"val/math/acc", "val/gsm8k/acc", "val/lighteval/MATH/acc"} <= set(metrics)
    samples = [json.loads(line) for line in (run_dir / "val_generations" / "step_0.jsonl").read_text().splitlines()]
    assert [s["ground_truth"] for s in samples] == [truth for _, truth in rows]
    assert all(set(s["result"]) >= {"format", "acc"} for s in samples)
    # nothing trained, nothing saved (the run held the directory's lock: run_lock.py)
    assert not ckpt.exists() or not [p for p in ckpt.iterdir() if p.name != LOCK_FILE]
