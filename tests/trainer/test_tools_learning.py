"""The tool demo learns to use its tool (+recipe=tiny_tools, HF engine): within a few steps nearly every response
hands its turn to the lookup tool, which only the reward's rule (an answer counts after the tool's answer)
makes worth it, then it names the role the tool returned (greedy validation >= 0.9, where a guess after the
lookup gets about half); with multi_turn.enable=false on the same data nothing scores. docs/multi_turn.md."""

import statistics

import pytest

from logicrl.data.role_task import write
from logicrl.data.role_tool_task import generate
from tests.conftest import ROOT, read_metrics, run_main, tail

pytestmark = pytest.mark.slow


def run(tmp_path, name, data, *overrides) -> list[dict]:
    run_dir = tmp_path / name
    result = run_main("+recipe=tiny_tools", f"data.train_files={data}/train.parquet",
                      f"data.val_files={data}/test.parquet", "actor_rollout_ref.rollout.name=hf",
                      "trainer.logger=[jsonl]", "trainer.val_before_train=false", "trainer.seed=7", *overrides,
                      f"hydra.run.dir={run_dir}", f"trainer.default_local_dir={run_dir}/ckpt", cwd=ROOT)
    assert result.returncode == 0, tail(result)
    assert (run_dir / "curves.png").stat().st_size > 0  # reward, accuracy and, with tools, the calls per step
    return read_metrics(run_dir)


def test_the_model_learns_to_use_its_tool_and_nothing_scores_without_it(tmp_path):
    data = tmp_path / "data"
    write(generate(people=3, train_size=2000, test_size=200), data)
    rows = run(tmp_path, "tools", data)  # the recipe's 60 steps, validated every 10
    calls = [r["tool/calls_per_sample"] for r in rows if "tool/calls_per_sample" in r]
    acc = [r["reward/acc/mean"] for r in rows if "reward/acc/mean" in r]
    val = [r["val/acc"] for r in rows if "val/acc" in r]
    print(f"with tools: calls per sample {calls[0]:.2f} -> {calls[-1]:.2f}, accuracy {acc[0]:.2f} -> {acc[-1]:.2f}, "
          f"val/acc {val}")
    assert calls[0] < 0.5 and min(calls[-5:]) > 0.9
    assert len(val) == 6 and val[-1] >= 0.9 and statistics.mean(acc[-5:]) >= 0.9
    # Without the tool the same data and steps: no answer ever follows a tool's, so nothing scores.
    off = run(tmp_path, "off", data, "actor_rollout_ref.rollout.multi_turn.enable=false",
              "trainer.total_training_steps=10")
    assert all(r["reward/acc/mean"] == 0 and "tool/calls_per_sample" not in r for r in off if "reward/acc/mean" in r)
    assert [r["val/acc"] for r in off if "val/acc" in r] == [0.0]


def test_a_run_with_tools_killed_in_step_2_resumes_bit_exactly(tmp_path):
    """Nothing of the tool loop is kept between steps (tools are called afresh, every turn's seed comes from the
    step's): a run killed while generating step 2 resumes from step 1 and ends as the uninterrupted run does."""
    from logicrl.config.phases import ARR
    from tests.conftest import TINY_RUN

    data = tmp_path / "data"
    write(generate(people=3, train_size=8, test_size=4), data)
    mt = f"{ARR}.rollout.multi_turn"
    args = [f"data.train_files={data}/train.parquet", f"data.val_files={data}/test.parquet", *TINY_RUN,
            "trainer.n_gpus=2", f"{ARR}.rollout.n=4", f"{ARR}.actor.ppo_micro_batch_size_per_gpu=4",
            "data.max_prompt_length=128", "data.max_response_length=40", "trainer.save_freq=1", f"{mt}.enable=true",
            f"{mt}.function_tool_path={ROOT / 'recipes/tools/lookup.py'}"]
    whole = run_main(*args, ckpt=tmp_path / "ckpt_a", run_dir=tmp_path / "run_a")
    assert whole.returncode == 0, tail(whole)
    reference = read_metrics(tmp_path / "run_a")
    killed = run_main(*args, ckpt=tmp_path / "ckpt_b", run_dir=tmp_path / "run_b1", fault="sigkill@generate:2")
    assert killed.returncode == -9, tail(killed)
    resumed = run_main(*args, ckpt=tmp_path / "ckpt_b", run_dir=tmp_path / "run_b2")
    assert resumed.returncode == 0, tail(resumed)
    ours = read_metrics(tmp_path / "run_b2")
    assert [r["step"] for r in ours] == [2]
    same = [k for k in reference[1] if k.startswith(("tool/calls", "tool/failure", "tool/token", "num_turns/",
                                                     "critic/score", "actor/pg_loss", "actor/grad_norm",
                                                     "response_length/"))]
    assert len(same) >= 10 and {k: ours[0][k] for k in same} == {k: reference[1][k] for k in same}
