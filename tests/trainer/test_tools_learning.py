"""The tool demo learns (+recipe=tiny_tools, HF engine): the model learns to hand its turn to the lookup tool,
then to name the role the tool returned; the same run with multi_turn.enable=false scores nothing, because
only the tool's answer makes an answer count (reward/role_tool.py)."""

import pytest

from logicrl.data.role_tool_task import generate, write
from tests.conftest import ROOT, read_metrics, run_main, tail

pytestmark = pytest.mark.slow


def run(tmp_path, name, data, *overrides) -> list[dict]:
    run_dir = tmp_path / name
    result = run_main("+recipe=tiny_tools", f"data.train_files={data}/train.parquet",
                      f"data.val_files={data}/test.parquet",
                      "actor_rollout_ref.rollout.name=hf", "trainer.logger=[jsonl]", "trainer.val_before_train=false",
                      "trainer.seed=7", *overrides, f"hydra.run.dir={run_dir}",
                      f"trainer.default_local_dir={run_dir}/ckpt", cwd=ROOT)
    assert result.returncode == 0, tail(result)
    return read_metrics(run_dir)


def test_validation_accuracy_needs_the_tool(tmp_path):
    data = tmp_path / "data"
    write(generate(people=3, train_size=2000, test_size=200), data)
    rows = run(tmp_path, "tools", data)
    val = [r["val/acc"] for r in rows if "val/acc" in r]
    calls = [r["tool/calls_per_sample"] for r in rows if "tool/calls_per_sample" in r]
    print(f"with tools: val/acc {val}, calls per sample {calls[0]:.2f} -> {calls[-1]:.2f}")
    assert calls[-1] > 0.9 > calls[0]
    assert val[-1] >= 0.9
    off = run(tmp_path, "off", data, "actor_rollout_ref.rollout.multi_turn.enable=false",
              "trainer.total_training_steps=10")
    assert max(r["val/acc"] for r in off if "val/acc" in r) <= 0.1
