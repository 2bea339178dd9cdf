"""The rollout engine registry: vllm is the default, and without vLLM a run still trains, with hf."""

import logging
import sys

import torch

from logicrl.config import compose
from logicrl.models.loading import load_tokenizer
from logicrl.workers.rollout.engines import build_engine
from logicrl.workers.rollout.hf import HFRolloutEngine


def test_vllm_is_the_default_engine():
    assert compose([]).actor_rollout_ref.rollout.name == "vllm"


def test_without_vllm_the_hf_engine_is_built_and_the_log_says_why(monkeypatch, caplog):
    monkeypatch.setitem(sys.modules, "vllm", None)  # what find_spec and import see when it is not installed
    cfg = compose(["actor_rollout_ref.rollout.name=vllm", "actor_rollout_ref.rollout.tensor_model_parallel_size=2"])
    with caplog.at_level(logging.WARNING, logger="logicrl.rollout"):
        engine = build_engine(cfg, load_tokenizer("embedded:tiny"), torch.float32, torch.device("cpu"), max_num_seqs=4)
    assert isinstance(engine, HFRolloutEngine)
    assert "rollout.name=vllm but vLLM is not installed" in caplog.text and "generating with hf" in caplog.text
    assert "tensor_model_parallel_size=2 needs vLLM" in caplog.text
