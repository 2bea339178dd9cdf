"""The worker's phase declarations against the phase table: one method per worker phase, and a
retried phase always has a micro-batch for its retry to halve. Parses nothing, builds no model."""

import pytest

from logicrl.config.phases import STEP, WORKER_PHASES, phase
from logicrl.workers.hybrid import DECLARED, HybridWorker, worker_phase


def test_every_worker_phase_of_the_table_is_declared_once():
    assert sorted(DECLARED) == sorted(WORKER_PHASES)
    for name, declared in DECLARED.items():
        assert getattr(HybridWorker, f"_{name}") is declared.method  # the method the declaration sits on


def test_declarations_take_model_and_forward_only_from_the_table():
    for name, declared in DECLARED.items():
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
