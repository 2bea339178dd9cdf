"""A third rollout engine registered from this module alone, no file of the package touched: its row of
config/engines.py is what validation, the memory plan, the preflight and a rank's engine builder read."""

from __future__ import annotations

import logging
from dataclasses import replace

import pytest
import torch

from logicrl.config import ConfigError, compose, validate
from logicrl.config.engines import ENGINES, EngineRow
from logicrl.config.phases import ARR
from logicrl.memory.fit import auto_micro_batch
from logicrl.memory.footprint import kv_bytes_per_token
from logicrl.memory.planner import plan_inputs
from logicrl.models.loading import load_tokenizer
from logicrl.preflight.memory import check_memory, plan_for
from logicrl.workers.rollout import RolloutEngine, RolloutOutput
from logicrl.workers.rollout.engines import build_engine


class StubEngine:
    """Answers every prompt with its first EOS: enough of a RolloutEngine to show which class a rank builds."""

    weights_valid = True

    def __init__(self, eos: int, pad: int, micro_batch_size: int):
        self.eos, self.pad, self.micro_batch_size = eos, pad, micro_batch_size

    def generate(self, input_ids, attention_mask, params, micro_batch_size=None) -> RolloutOutput:
        rows = input_ids.shape[0] * params.n
        responses = torch.full((rows, params.max_tokens), self.pad, dtype=torch.long)
        responses[:, 0] = self.eos
        mask = torch.zeros_like(responses)
        mask[:, 0] = 1
        return RolloutOutput(responses, mask, torch.zeros(rows, params.max_tokens))

    def sync_weights(self, named_tensors) -> None:
        for _ in named_tensors:
            pass

    def sync_adapters(self, named_tensors) -> None:
        for _ in named_tensors:
            pass

    def sleep(self) -> None:
        pass

    def wake(self) -> None:
        pass


def build_stub(cfg, tokenizer, dtype, device, max_num_seqs: int) -> StubEngine:
    return StubEngine(tokenizer.eos_token_id, tokenizer.pad_token_id, max_num_seqs)


class StubFootprint:
    """Its weights, and a KV cache reserved at start-up for exactly rollout.max_num_seqs full-length
    sequences, kept while the trainer runs (it never sleeps)."""

    preallocates_kv = True

    def resident(self, x, engine, capacity, awake):
        return engine.total_full, x.gen_micro * x.width * kv_bytes_per_token(x.spec, x.dtype_bytes)

    def generating(self, x):
        return "", {}

    def syncing(self, x, engine, capacity):
        return self.resident(x, engine, capacity, awake=False)

    def adapters_held(self, every, largest):
        return every

    def kv_from_utilization(self, x):
        return False


FOOTPRINT = StubFootprint()
ROW = EngineRow(label="Stub", package=None, install="", fallback=None, tensor_parallel=False, sleep_levels=(),
                adapter_sync=True, max_lora_rank=None, adapters_on_linears_only=False, prequantized=(),
                schedules_own_batches=False, returns_logprobs=True,
                footprint=f"{__name__}:FOOTPRINT", builder=f"{__name__}:build_stub")
STUB = [f"{ARR}.rollout.name=stub", f"{ARR}.rollout.max_num_seqs=8"]
# The embedded tiny model in bf16 (trainer.gpu_memory_gb plans CUDA; dtype auto): K and V of 2 layers of
# 1 KV head of 64, 2 bytes each, per token; rows of 128 prompt + 4 response tokens.
TINY_KV_PER_TOKEN = 2 * 2 * 1 * 64 * 2
WIDTH = 128 + 4


@pytest.fixture
def stub(monkeypatch):
    monkeypatch.setitem(ENGINES, "stub", ROW)
    return ROW


def test_the_schema_takes_a_registered_engine_and_refuses_one_without_a_row(data_files, stub):
    cfg, _, _ = validate(compose([*data_files, *STUB]))
    assert cfg[ARR].rollout.name == "stub"
    with pytest.raises(ConfigError) as err:
        validate(compose([*data_files, f"{ARR}.rollout.name=sglang"]))
    assert str(err.value) == f"{ARR}.rollout.name=sglang is not one of: vllm, hf, stub"


def test_validation_reads_its_traits(data_files, stub, monkeypatch):
    with pytest.raises(ConfigError) as err:
        validate(compose([*data_files, *STUB, "trainer.n_gpus=2", f"{ARR}.rollout.tensor_model_parallel_size=2"]))
    assert "\n" not in str(err.value)
    assert str(err.value).startswith(f"{ARR}.rollout.tensor_model_parallel_size=2 needs {ARR}.rollout.name=vllm "
                                     "(the stub engine holds the whole model on each rank)")
    monkeypatch.setitem(ENGINES, "stub", replace(ROW, returns_logprobs=False))
    with pytest.raises(ConfigError, match=r"^algorithm.rollout_correction.rollout_is=token needs the engine's "
                                          r"log-probs, and the stub engine .* returns none"):
        validate(compose([*data_files, *STUB]))
    validate(compose([*data_files, *STUB, "algorithm.rollout_correction.rollout_is=null"]))
    monkeypatch.setitem(ENGINES, "stub", replace(ROW, adapter_sync=False))
    with pytest.raises(ConfigError, match=r"lora_sync=adapters but the stub engine .* cannot take adapters alone: "
                                          r"set actor_rollout_ref.rollout.lora_sync=merged, or use vllm or hf"):
        validate(compose([*data_files, *STUB, f"{ARR}.model.lora_rank=4"]))


def test_the_plan_holds_its_own_kv_cache_formula(data_files, stub):
    cfg, spec, plan = validate(compose([*data_files, *STUB, "trainer.gpu_memory_gb=24"]))
    x, cap, _ = plan_for(cfg, spec, plan)
    assert x.engine == "stub"
    memory = plan_inputs(x, cap)
    kv = 8 * WIDTH * TINY_KV_PER_TOKEN
    assert memory.phase("generate").parts["kv_cache"] == kv
    # It never sleeps: the cache stays beside the trainer's update (vLLM on CUDA releases it: 0 there).
    assert memory.phase("update_actor").parts["kv_cache"] == kv
    vllm = plan_inputs(replace(x, engine="vllm"), cap)
    assert vllm.phase("update_actor").parts["kv_cache"] == 0 != vllm.phase("generate").parts["kv_cache"] != kv


def test_auto_micro_batch_sizes_generate_unless_it_schedules_its_own_batches(data_files, stub, monkeypatch):
    cfg, spec, plan = validate(compose([*data_files, *STUB, "trainer.gpu_memory_gb=24",
                                        f"{ARR}.rollout.max_num_seqs=4"]))
    x, cap, _ = plan_for(cfg, spec, plan)
    assert auto_micro_batch(x, cap)[f"{ARR}.rollout.max_num_seqs"] > 4  # every response of the rank fits
    monkeypatch.setitem(ENGINES, "stub", replace(ROW, schedules_own_batches=True))
    assert f"{ARR}.rollout.max_num_seqs" not in auto_micro_batch(x, cap)


def test_the_preflight_plans_it_and_refuses_it_where_its_package_is_missing(data_files, stub, monkeypatch, caplog):
    stage = validate(compose([*data_files, *STUB, "trainer.gpu_memory_gb=24"]))
    planned = check_memory(*stage)
    assert planned.memory.inputs.engine == "stub"
    assert f"note: Stub's KV cache holds 8 sequences of {WIDTH} tokens at once" in planned.table
    monkeypatch.setitem(ENGINES, "stub", replace(ROW, package="logicrl_no_such_package", install="pip install it"))
    with pytest.raises(ConfigError) as err:
        check_memory(*stage)
    assert str(err.value) == (f"{ARR}.rollout.name=stub but Stub is not installed (pip install it): install it, or "
                              f"set {ARR}.rollout.name to another engine")
    dry = validate(compose([*data_files, *STUB, "trainer.gpu_memory_gb=24", "trainer.dry_run=true"]))
    assert check_memory(*dry).memory.inputs.engine == "stub"  # a dry run plans for where the package will be
    monkeypatch.setitem(ENGINES, "stub", replace(ENGINES["stub"], fallback="hf"))
    with caplog.at_level(logging.WARNING, logger="logicrl.preflight"):
        assert check_memory(*stage).memory.inputs.engine == "hf"
    assert f"{ARR}.rollout.name=stub but Stub is not installed (pip install it): generating with hf" in caplog.text


def test_a_rank_builds_it_with_its_rows_builder(stub):
    cfg = compose(STUB)
    engine = build_engine(cfg, load_tokenizer("embedded:tiny"), torch.float32, torch.device("cpu"), max_num_seqs=8)
    assert isinstance(engine, StubEngine) and isinstance(engine, RolloutEngine)
    assert engine.micro_batch_size == 8
