"""+recipe=eval_math over two checkpoints (the embedded model, and a run's last checkpoint found from its
directory): one table, pass@k non-decreasing in k, and samples.jsonl recomputing to eval.json. One
evaluation launch for the module: the run's directory is written by the trainer's own save code
(trainer/checkpoint.py `saving`: steps 1 and 2, each committed with its export), the embedded model as
step 2's export; that a trained run's export loads and generates: tests/trainer/test_curriculum_resume.py."""

import json
import shutil

import pandas as pd
import pytest

from logicrl.config.phases import ARR
from logicrl.eval.report import group_metrics, read_samples
from logicrl.models.loading import checkpoint_dir
from logicrl.models.tiny import EMBEDDED_TINY
from logicrl.trainer.checkpoint import saving
from tests.conftest import ROOT, need_data, read_metrics, run_main, tail

pytestmark = pytest.mark.integration
KS = [1, 2, 4]


@pytest.fixture(scope="module")
def evaluated(tmp_path_factory):
    need_data("kk_role"), need_data("kk_role_5ppl")
    tmp = tmp_path_factory.mktemp("eval")
    # Two small validation sets that differ by people count: 8 + 4 problems.
    val = tmp / "val.parquet"
    pd.concat([pd.read_parquet(ROOT / "data/kk_role/test.parquet").head(8),
               pd.read_parquet(ROOT / "data/kk_role_5ppl/test.parquet").head(4)]).to_parquet(val)
    ckpt = tmp / "ckpt"
    for step in (1, 2):  # what a run's checkpoint root holds: its newest complete step is the one evaluated
        with saving(ckpt, step) as saved:
            shutil.copytree(checkpoint_dir(EMBEDDED_TINY), saved / "huggingface")
    run_dir = tmp / "eval"
    result = run_main("+recipe=eval_math", f"data.val_files={val}", "data.max_prompt_length=128",
                      "data.max_response_length=4", f"{ARR}.rollout.name=hf", "eval.n=4", f"eval.k={KS}",
                      "eval.temperature=1.0", f"eval.checkpoints=[{checkpoint_dir(EMBEDDED_TINY)},{ckpt}]",
                      run_dir=run_dir, ckpt=tmp / "unused")
    assert result.returncode == 0, tail(result)
    return result, run_dir


def test_one_table_across_checkpoints(evaluated):
    result, run_dir = evaluated
    assert result.stdout.count("| checkpoint | data_source |") == 1
    results = json.loads((run_dir / "eval.json").read_text())
    base, last = list(results)
    assert last == "ckpt/global_step_2"  # the run's newest complete checkpoint, from its directory
    for by_group in results.values():
        assert set(by_group) == {"kk_role", "kk_role/3ppl", "kk_role/5ppl"}
        for by_metric in by_group.values():
            passes = [by_metric[f"pass@{k}"]["value"] for k in KS]
            assert passes == sorted(passes), by_metric
            assert all(v["low"] <= v["value"] <= v["high"] for v in by_metric.values())
    for name in (f"| {base} | kk_role/5ppl |", "| ckpt/global_step_2 | kk_role |"):
        assert name in result.stdout
    assert (run_dir / "pass_at_k.png").stat().st_size > 0 and (run_dir / "eval.md").is_file()


def test_samples_reproduce_eval_json(evaluated):
    _, run_dir = evaluated
    results = json.loads((run_dir / "eval.json").read_text())
    by_checkpoint = read_samples(run_dir / "samples.jsonl")
    assert list(by_checkpoint) == list(results)
    for label, samples in by_checkpoint.items():
        assert len(samples) == 12 * 4
        assert {"data_source", "problem", "sample", "response", "answer", "score", "completed"} <= set(samples[0])
        assert json.loads(json.dumps(group_metrics(samples, KS))) == results[label]


def test_metrics_jsonl_has_the_same_numbers(evaluated):
    _, run_dir = evaluated
    results = json.loads((run_dir / "eval.json").read_text())
    (row,) = read_metrics(run_dir / "02_ckpt_global_step_2")
    got = results["ckpt/global_step_2"]["kk_role/3ppl"]["pass@2"]
    assert row["val/kk_role/3ppl/pass@2"] == pytest.approx(got["value"])
    assert row["val/kk_role/3ppl/pass@2/high"] == pytest.approx(got["high"])
