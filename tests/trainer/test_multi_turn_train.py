"""Multi-turn rollouts through the real entry point: two CPU ranks train on the tool demo's task with the lookup
function tool, and what a user sees (metrics, validation samples, the log) shows the loop ran. One launch for
every assertion; the mechanics themselves are checked with a scripted engine (tests/workers/test_multi_turn.py)."""

from __future__ import annotations

import json

import pytest

from logicrl.config.phases import ARR
from logicrl.data.role_task import write
from logicrl.data.role_tool_task import generate, tool_answer
from tests.conftest import ROOT, TINY_RUN, read_metrics, run_main, tail

pytestmark = pytest.mark.integration
MT = f"{ARR}.rollout.multi_turn"
OPENING = "<answer> It is a"


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("tools")
    write(generate(people=3, train_size=8, test_size=4), tmp / "data")
    run_dir = tmp / "run"
    result = run_main(
        f"data.train_files={tmp / 'data/train.parquet'}", f"data.val_files={tmp / 'data/test.parquet'}",
        *TINY_RUN, "trainer.n_gpus=2", f"{ARR}.rollout.n=4", f"{ARR}.actor.ppo_micro_batch_size_per_gpu=4",
        "data.max_prompt_length=128", "data.max_response_length=40", "trainer.test_freq=2",
        f"{MT}.enable=true", f"{MT}.max_assistant_turns=2",
        f"{MT}.function_tool_path={ROOT / 'recipes/tools/lookup.py'}", f"{MT}.assistant_opening='{OPENING}'",
        f"hydra.run.dir={run_dir}", cwd=tmp)
    assert result.returncode == 0, tail(result)
    return run_dir, result


def test_every_step_reports_its_turns_and_tool_calls(run):
    rows = [r for r in read_metrics(run[0]) if "tool/calls_per_sample" in r]
    assert len(rows) == 2
    for r in rows:
        assert 1 <= r["num_turns/mean"] <= r["num_turns/max"] <= 2
        assert 0 <= r["tool/failure_rate"] <= 1 and 0 <= r["tool/token_share"] < 1
        # response_length/* count the sampled tokens; the trajectory, tool output too.
        assert r["response_length/mean"] < r["trajectory_length/mean"] if r["tool/calls_per_sample"] > 0 else \
            r["response_length/mean"] == r["trajectory_length/mean"]
        # A sample with a tool turn has tool tokens, and only those are attended but not trained.
        assert (r["tool/calls_per_sample"] > 0) == (r["tool/token_share"] > 0)


def test_validation_samples_show_the_whole_conversation(run):
    samples = [json.loads(line) for line in (run[0] / "val_generations" / "step_2.jsonl").read_text().splitlines()]
    assert samples and all("conversation" in s for s in samples)
    called = [s for s in samples if "<|im_start|>tool" in s["conversation"]]
    for s in called:  # the lookup's answer, from the row's tools_kwargs, then the next turn's opening
        truth = s["ground_truth"]
        answered = f"{tool_answer(truth['name'], truth['role'])}<|im_end|>\n<|im_start|>assistant\n{OPENING}"
        assert answered in s["conversation"]


def test_the_plan_states_the_turn_budget_and_no_data_warning_fires(run):
    out = run[1].stdout + run[1].stderr
    assert "multi-turn with tools (" in out and "data.max_response_length=40" in out
    assert f"each answer followed by the opening {OPENING!r}" in out
    assert "no row of data.train_files" not in out  # the rows carry tools_kwargs
