"""The rollout engine registry: vllm is the default, each row of config/engines.py names what a rank builds,
and where vLLM does not import a run still trains, with hf, planned for hf (one decision: resolve_engine)."""

import logging
import sys

import pytest
import torch

from logicrl.config import compose, validate
from logicrl.config.engines import ENGINES, load
from logicrl.memory.engine import EngineFootprint
from logicrl.models.loading import load_tokenizer
from logicrl.preflight.memory import plan_for
from logicrl.workers.rollout.engines import build_engine
from logicrl.workers.rollout.hf import HFRolloutEngine

BROKEN = "libcudart.so.12: cannot open shared object file: No such file or directory"


def test_vllm_is_the_default_engine():
    assert compose([]).actor_rollout_ref.rollout.name == "vllm"


def test_every_row_names_a_builder_and_a_footprint():
    for name, row in ENGINES.items():
        assert callable(load(row.builder)), name
        footprint = load(row.footprint)
        assert all(hasattr(footprint, member) for member in EngineFootprint.__annotations__), name
        assert all(callable(getattr(footprint, m)) for m in ("resident", "generating", "syncing", "adapters_held",
                                                             "kv_from_utilization")), name
        assert row.fallback is None or ENGINES[row.fallback].package is None, name  # a fallback always runs


def test_without_vllm_the_hf_engine_is_built_and_the_log_says_why(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "vllm", None)  # what find_spec and import see when it is not installed
    cfg = compose(["actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.tensor_model_parallel_size=2"])
    with caplog.at_level(logging.WARNING, logger="logicrl.rollout"):
        engine = build_engine(cfg, load_tokenizer("embedded:tiny"), torch.float32, torch.device("cpu"), max_num_seqs=4)
    assert isinstance(engine, HFRolloutEngine)
    assert "rollout.name=vllm but vLLM is not installed" in caplog.text and "generating with hf" in caplog.text
    assert "tensor_model_parallel_size=2 needs vLLM" in caplog.text


@pytest.fixture
def broken_vllm(tmp_path, monkeypatch):
    """A vLLM that is installed but fails to import (a CUDA wheel beside CPU torch)."""
    (tmp_path / "vllm").mkdir()
    (tmp_path / "vllm" / "__init__.py").write_text(f"raise ImportError({BROKEN!r})\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "vllm", raising=False)


def test_a_vllm_that_fails_to_import_is_planned_and_built_as_hf(broken_vllm, data_files, caplog):
    line = f"actor_rollout_ref.rollout.name=vllm but importing vLLM failed (ImportError: {BROKEN}): generating with hf"
    cfg, spec, plan = validate(compose([*data_files, "actor_rollout_ref.rollout.name=vllm"]))
    with caplog.at_level(logging.WARNING, logger="logicrl.preflight"):
        x, _, _ = plan_for(cfg, spec, plan)
    assert x.engine == "hf"
    assert line in caplog.text
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="logicrl.rollout"):
        engine = build_engine(cfg, load_tokenizer("embedded:tiny"), torch.float32, torch.device("cpu"), max_num_seqs=4)
    assert isinstance(engine, HFRolloutEngine)
    assert line in caplog.text
    # A dry run plans for wherever the run will go: it looks for the package, and imports nothing.
    dry = validate(compose([*data_files, "actor_rollout_ref.rollout.name=vllm", "trainer.dry_run=true"]))
    assert plan_for(*dry)[0].engine == "vllm"
