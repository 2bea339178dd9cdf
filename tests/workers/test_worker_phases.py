"""The workers' phase declarations against the phase table: the colocated worker declares one method per
worker phase, a retried phase always has a micro-batch for its retry to halve, and each worker class keeps
its own declarations. Parses nothing, builds no model."""

import pytest

from logicrl.config.phases import STEP, WORKER_PHASES, phase
from logicrl.workers.hybrid import HybridWorker
from logicrl.workers.phase_worker import PhaseWorker, worker_phase


def test_every_worker_phase_of_the_table_is_declared_once():
    assert sorted(HybridWorker.phases) == sorted(WORKER_PHASES)
    for name, declared in HybridWorker.phases.items():
        assert declared.name == name
        assert getattr(HybridWorker, declared.method.__name__) is declared.method  # the method it sits on


def test_declarations_take_model_and_forward_only_from_the_table():
    for name, declared in HybridWorker.phases.items():
        row = phase(name)
        assert (declared.model, declared.resharded) == (row.model, row.forward_only)
        if declared.retried:  # the step plan gives it a micro-batch (config/plan.py micro_of)
            assert row.rows_key is not None, name


def test_a_controller_phase_or_an_unknown_name_cannot_be_declared():
    on_controller = next(p.name for p in STEP if not p.on_worker)
    with pytest.raises(ValueError, match=f"{on_controller} runs on the controller"):
        worker_phase(on_controller, retried=False)
    with pytest.raises(KeyError, match="no phase 'genrate'"):
        worker_phase("genrate", retried=True)


class RolloutOnly(PhaseWorker):
    """A worker with the engine alone: it declares generation and nothing else."""

    @worker_phase("generate", retried=False)
    def generate(self, batch, retry):
        return None, {"generated": 1.0}


def test_a_second_worker_class_declares_its_own_phases_without_changing_the_first():
    before = dict(HybridWorker.phases)
    assert list(RolloutOnly.phases) == ["generate"]
    assert RolloutOnly.phases["generate"].method is RolloutOnly.generate
    assert dict(HybridWorker.phases) == before
    assert HybridWorker.phases["generate"].method is not RolloutOnly.generate


def test_a_subclass_inherits_its_bases_phases_and_may_replace_one():
    class Slower(RolloutOnly):
        @worker_phase("update_weights", retried=False)
        def receive(self, batch, retry):
            return None, {}

    class Replaced(RolloutOnly):
        @worker_phase("generate", retried=True)
        def generate_again(self, batch, retry):
            return None, {}

    assert sorted(Slower.phases) == ["generate", "update_weights"]
    assert Replaced.phases["generate"].method is Replaced.generate_again
    assert list(RolloutOnly.phases) == ["generate"]


def test_one_class_cannot_declare_a_phase_twice():
    with pytest.raises(ValueError, match="declares phase 'generate' twice"):
        class Twice(PhaseWorker):
            @worker_phase("generate", retried=False)
            def one(self, batch, retry):
                return None, {}

            @worker_phase("generate", retried=False)
            def two(self, batch, retry):
                return None, {}


def test_run_refuses_a_phase_its_class_does_not_declare():
    worker = RolloutOnly.__new__(RolloutOnly)
    with pytest.raises(ValueError, match="no worker phase 'update_actor' on RolloutOnly; it runs generate"):
        worker.run(None, "update_actor")


@pytest.mark.parametrize("track", [True, False])
def test_step_1_measures_live_tensors_unless_the_config_says_not(track):
    from logicrl.faults import Faults

    class Bare(RolloutOnly):
        def module(self, model):
            return None  # the engine alone: no FSDP2 module

    worker = Bare.__new__(Bare)
    worker.faults, worker.rank, worker.device, worker.sizes = Faults(), 0, "cpu", {}
    worker.track_tensor_peaks = track  # trainer.track_tensor_peaks, as HybridWorker._start_rank sets it
    _, step_1 = worker.run(None, "generate", step=1)
    _, step_2 = worker.run(None, "generate", step=2)
    assert ("perf/memory/generate/tensor_peak_gb" in step_1) == track
    assert "perf/memory/generate/tensor_peak_gb" not in step_2 and "perf/memory/generate/rss_peak_gb" in step_1
