"""A quantized base's refusals (config/quantization.py): one line each, before anything loads."""

import importlib.util

import pytest

from logicrl.config import ConfigError, compose, validate
from logicrl.config.phases import ARR
from tests.conftest import BASE_BATCH

NF4 = f"{ARR}.model.quantization=nf4"


def refusal(data, *overrides) -> str:
    with pytest.raises(ConfigError) as e:
        validate(compose([*data, *BASE_BATCH, *overrides]))
    assert "\n" not in str(e.value)
    return str(e.value)


def test_a_quantized_base_without_lora_is_refused(data):
    line = refusal(data, NF4)
    assert f"{NF4} with {ARR}.model.lora_rank=0" in line and "set lora_rank > 0" in line


def test_the_missing_package_is_named_with_its_extra(data, monkeypatch):
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "torchao" else real(name, *a))
    line = refusal(data, NF4, f"{ARR}.model.lora_rank=4")
    assert "needs torchao" in line and "logicrl[quant]" in line
    # A dry run loads nothing: it plans the run without the package.
    validate(compose([*data, *BASE_BATCH, NF4, f"{ARR}.model.lora_rank=4", "trainer.dry_run=true"]))


def test_a_block_that_does_not_divide_a_linear_is_refused(data):
    pytest.importorskip("torchao")
    # The tiny model's q_proj is 128 x 128 = 16,384 weights; 16,384 % 96 = 64 (the first Linear checked).
    line = refusal(data, NF4, f"{ARR}.model.lora_rank=4", f"{ARR}.model.quantization_block_size=96")
    assert "quantization_block_size=96 does not divide q_proj's 16,384 weights" in line


def test_an_unknown_method_is_refused(data):
    assert "is not one of: nf4" in refusal(data, f"{ARR}.model.quantization=int3", f"{ARR}.model.lora_rank=4")


def test_the_adapter_sync_is_kept_over_a_quantized_base(data):
    # Not derived merged any more: the engine is sent the dequantized base once, then adapters
    # (docs/quantization.md); merged stays selectable.
    pytest.importorskip("torchao")
    typed, _, _ = validate(compose([*data, *BASE_BATCH, NF4, f"{ARR}.model.lora_rank=4"]))
    assert typed[ARR].rollout.lora_sync == "adapters"
    typed, _, _ = validate(compose([*data, *BASE_BATCH, NF4, f"{ARR}.model.lora_rank=4",
                                    f"{ARR}.rollout.lora_sync=merged"]))
    assert typed[ARR].rollout.lora_sync == "merged"
