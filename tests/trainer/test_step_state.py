"""A step's own state (trainer/step_state.py) and the controller's phase dispatch into it (trainer/dispatch.py),
over a fake in-process group: two steps' phases can be in flight and each keeps its own metrics."""

from types import SimpleNamespace

import torch
from omegaconf import OmegaConf
from tensordict import TensorDict

from logicrl.controller.pending import Done
from logicrl.faults import Faults
from logicrl.trainer.dispatch import PhaseDispatch
from logicrl.trainer.step_state import StepState

SP = "ulysses_sequence_parallel_size"


def test_a_phase_called_twice_sums_its_times_keeps_its_highest_peak_and_its_last_other_values():
    state = StepState(step=3)
    state.add_rank_metrics([{"timing_s/generate": 1.0, "perf/memory/generate/peak_gb": 2.0, "x": 1.0},
                            {"timing_s/generate": 3.0, "perf/memory/generate/peak_gb": 1.0, "x": 2.0}])
    state.add_rank_metrics([{"timing_s/generate": 0.5, "perf/memory/generate/peak_gb": 1.5, "x": 5.0},
                            {"timing_s/generate": 0.25, "perf/memory/generate/peak_gb": 4.0, "x": 6.0}])
    assert state.rank_metrics == [{"timing_s/generate": 1.5, "perf/memory/generate/peak_gb": 2.0, "x": 5.0},
                                  {"timing_s/generate": 3.25, "perf/memory/generate/peak_gb": 4.0, "x": 6.0}]
    assert state.rank_times("generate") == [1.5, 3.25] and state.rank_times("values") == [0.0, 0.0]
    assert StepState(step=4).rank_metrics == [] and StepState(step=4).metrics == {}  # nothing shared


class FakeGroup:
    """Four in-process ranks: each returns its shard's `x` times 10 under the phase's output key, and the
    metrics {timing_s/<phase>: rank + 1}. Calls are recorded as issued."""

    def __init__(self, ranks: int = 4):
        self.ranks, self.issued = ranks, []

    def _run(self, rank, shard, phase, step, **kwargs):
        out = None if shard is None else TensorDict({f"{phase}_out": shard["x"] * 10}, batch_size=shard.batch_size)
        return out, {f"timing_s/{phase}": float(rank + 1), "step_seen": float(-1 if step is None else step)}

    def call_async(self, method, shard, *, phase, step, **kwargs):
        self.issued.append((phase, step, kwargs))
        return Done.of(phase, [lambda r=r: self._run(r, shard, phase, step) for r in range(self.ranks)])

    def dispatch_async(self, method, shards, *, phase, step, **kwargs):
        self.issued.append((phase, step, kwargs))
        return Done.of(phase, [lambda r=r, s=s: self._run(r, s, phase, step) for r, s in enumerate(shards)])


def dispatcher(actor_sp: int = 1) -> tuple[PhaseDispatch, FakeGroup]:
    cfg = OmegaConf.create({"actor_rollout_ref": {"actor": {SP: actor_sp}, "ref": {SP: 1}}, "critic": {SP: 1},
                            "reward_model": {SP: 1}})
    group = FakeGroup()
    plan = SimpleNamespace(generating_ranks=4, training_ranks=4, ranks=4)
    return PhaseDispatch(group, cfg, plan, Faults(), ckpt_root=None), group


def batch_of(rows: int) -> TensorDict:
    return TensorDict({"x": torch.arange(rows, dtype=torch.float32)}, batch_size=[rows])


def test_what_the_ranks_return_joins_the_batch_and_their_metrics_the_state():
    calls, group = dispatcher()
    batch, state = batch_of(8), StepState(step=2)
    calls.run("generate", batch, state, params={"seed": 1})
    assert torch.equal(batch["generate_out"], torch.arange(8.0) * 10)
    assert group.issued == [("generate", 2, {"params": {"seed": 1}})]
    assert [m["timing_s/generate"] for m in state.rank_metrics] == [1.0, 2.0, 3.0, 4.0]
    assert all(m["step_seen"] == 2.0 for m in state.rank_metrics)
    assert state.metrics["timing_s/generate"] >= 0  # the controller's own time of the phase


def test_a_sequence_parallel_groups_ranks_return_the_same_rows_and_one_copy_is_kept():
    calls, _ = dispatcher(actor_sp=2)
    batch, state = batch_of(6), StepState(step=1)
    calls.run("old_log_prob", batch, state)  # 4 ranks in 2 groups of 2: 2 shards of 3 rows
    assert torch.equal(batch["old_log_prob_out"], torch.arange(6.0) * 10)
    assert len(state.rank_metrics) == 4  # the metrics of every rank


def test_two_steps_in_flight_keep_their_own_batches_and_metrics():
    calls, group = dispatcher()
    a_batch, a = batch_of(4), StepState(step=5)
    b_batch, b = batch_of(8), StepState(step=6)
    generating = calls.start("generate", b_batch, b)  # the next step's generation, issued first
    calls.start("update_weights", None, a)  # this step's sync, no rows
    training = calls.start("values", a_batch, a)
    calls.finish(training, a)
    calls.finish(generating, b)
    assert "values_out" in a_batch.keys() and "generate_out" not in a_batch.keys()
    assert "generate_out" in b_batch.keys() and "values_out" not in b_batch.keys()
    assert set(a.metrics) == {"timing_s/values"} and set(b.metrics) == {"timing_s/generate"}
    assert [m["step_seen"] for m in a.rank_metrics] == [5.0] * 4
    assert [m["step_seen"] for m in b.rank_metrics] == [6.0] * 4
    assert [(p, s) for p, s, _ in group.issued] == [("generate", 6), ("update_weights", 5), ("values", 5)]
