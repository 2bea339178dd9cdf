"""The controller's multi-turn report: metrics by hand, and each warning once, in one line."""

import logging
from types import SimpleNamespace

import pytest
import torch
from tensordict import TensorDict

from logicrl.trainer.turns import SILENT_STEPS, ToolWatch, data_warning, turn_metrics


def batch() -> TensorDict:
    # Row 0: 6 attended, 4 trained (2 tool tokens), 2 turns, 1 call; row 1: 3 attended and trained, 1 turn;
    # row 2: 8 attended, 4 trained, 3 turns, 2 calls of which 1 failed.
    attended = torch.tensor([[1] * 6 + [0] * 2, [1] * 3 + [0] * 5, [1] * 8])
    trained = torch.tensor([[1, 1, 0, 0, 1, 1, 0, 0], [1, 1, 1, 0, 0, 0, 0, 0], [1, 0, 0, 1, 1, 0, 0, 1]])
    return TensorDict({"response_attention_mask": attended, "response_mask": trained,
                       "num_turns": torch.tensor([2.0, 1.0, 3.0]), "tool_calls": torch.tensor([1.0, 0.0, 2.0]),
                       "tool_failures": torch.tensor([0.0, 0.0, 1.0]),
                       "tool_latency_s": torch.tensor([0.5, 0.0, 1.0])}, batch_size=[3])


def test_turn_metrics_by_hand():
    m = turn_metrics(batch())
    assert m["tool/calls_per_sample"] == pytest.approx(1.0)  # 3 calls / 3 samples
    assert m["tool/failure_rate"] == pytest.approx(1 / 3)
    assert m["tool/latency_s"] == pytest.approx(0.5)  # 1.5 s over 3 calls
    assert (m["num_turns/mean"], m["num_turns/max"]) == (2.0, 3.0)
    assert m["tool/token_share"] == pytest.approx(6 / 17)  # (2 + 0 + 4) tool tokens of 17 attended
    assert (m["trajectory_length/mean"], m["trajectory_length/max"]) == (pytest.approx(17 / 3), 8.0)
    assert not any(key.startswith("response_length/") for key in m)  # trainer/ppo.py's, from the loss mask


def test_a_single_turn_batch_has_no_turn_metrics():
    assert turn_metrics(batch().exclude("num_turns", "tool_calls", "tool_failures", "tool_latency_s")) == {}


def test_no_call_in_the_first_steps_warns_once(caplog):
    watch = ToolWatch(enabled=True)
    with caplog.at_level(logging.WARNING, logger="logicrl.trainer"):
        for step in range(1, 2 * SILENT_STEPS + 2):
            watch.observe(step, {"tool/calls_per_sample": 0.0})
    lines = [r.getMessage() for r in caplog.records]
    assert len(lines) == 1 and "\n" not in lines[0] and f"up to step {SILENT_STEPS}" in lines[0]
    caplog.clear()
    calling = ToolWatch(enabled=True)
    for step in range(1, 2 * SILENT_STEPS):
        calling.observe(step, {"tool/calls_per_sample": 0.0 if step % 2 else 0.5})
    assert not caplog.records


def test_rows_and_config_that_disagree_are_named():
    with_kwargs = [SimpleNamespace(extra_info={"tools_kwargs": {"lookup": {}}}), SimpleNamespace(extra_info={})]
    plain = [SimpleNamespace(extra_info={}), SimpleNamespace(extra_info=None)]
    off = data_warning(False, with_kwargs, "t.parquet")
    assert "1 of 2 rows" in off and "multi_turn.enable=false" in off
    assert "no row of data.train_files=t.parquet" in data_warning(True, plain, "t.parquet")
    assert data_warning(True, with_kwargs, "t.parquet") is None and data_warning(False, plain, "t.parquet") is None


def test_a_checkpoints_history_keeps_the_whole_trajectorys_length():
    """trainer.memory_plan=expected plans a resumed run for the lengths its history kept (memory/lengths.py):
    tool output takes memory as sampled tokens do, so a multi-turn step keeps its trajectories'."""
    from logicrl.trainer.summaries import history_row

    single = {"response_length/mean": 4.0, "response_length/max": 6.0}
    assert history_row(3, single) == {"step": 3, "len_mean": 4.0, "len_max": 6.0}
    tools = {**single, "trajectory_length/mean": 21.0, "trajectory_length/max": 24.0}
    assert history_row(3, tools) == {"step": 3, "len_mean": 21.0, "len_max": 24.0}
