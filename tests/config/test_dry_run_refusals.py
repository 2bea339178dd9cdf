"""A dry run says every refusal a launch would give, after the plan it would have run (exit 2); what only the
launching machine knows (a package installed there) is a warning. main_ppo.py's dry run in-process
(check_main), on shape configs (no weights)."""

import logging

import pytest

from logicrl.config import ConfigError, compose, validate
from logicrl.config.phases import ARR
from logicrl.config.quantization import check_quantization
from tests.conftest import BASE_BATCH, ROOT, assert_refused, check_main

GPTQ = ROOT / "logicrl/memory/shapes/qwen2.5-7b-gptq-int4"
ON_80GB = ["trainer.dry_run=true", "trainer.gpu_memory_gb=80", "trainer.device=cuda", "algorithm.adv_estimator=grpo"]


def test_a_gptq_base_under_vllm_is_refused_by_the_dry_run_after_its_plan(data_files, tmp_path):
    result = check_main(*data_files, *BASE_BATCH, *ON_80GB, f"{ARR}.model.path={GPTQ}", f"{ARR}.model.lora_rank=4",
                        f"{ARR}.rollout.name=vllm", cwd=tmp_path)
    assert_refused(result, f"{ARR}.rollout.name=vllm with a gptq base", f"set {ARR}.rollout.name=hf")
    # The plan came first, and it names the base's format and that every rank holds all of it.
    assert "memory plan per device" in result.out and "update_actor" in result.out
    assert "base pre-quantized: gptq int4, loaded as it is, replicated whole on every rank" in result.out
    # With the engine that holds it, the same dry run passes.
    ok = check_main(*data_files, *BASE_BATCH, *ON_80GB, f"{ARR}.model.path={GPTQ}", f"{ARR}.model.lora_rank=4",
                    f"{ARR}.rollout.name=hf", cwd=tmp_path)
    assert ok.code == 0, ok.line


def test_every_refusal_is_said_and_the_first_ends_the_dry_run(data_files, tmp_path):
    # Two at once: the engine (validation) and lora_sync; a launch stops at the first, the dry run names both.
    result = check_main(*data_files, *BASE_BATCH, *ON_80GB, f"{ARR}.model.path={GPTQ}", f"{ARR}.model.lora_rank=4",
                        f"{ARR}.rollout.name=vllm", f"{ARR}.rollout.lora_sync=merged", cwd=tmp_path)
    assert result.code == 2 and result.line.startswith(f"error: {ARR}.rollout.name=vllm with a gptq base")
    assert result.err.strip() == f"error: {ARR}.rollout.lora_sync=merged with a gptq base ({GPTQ}): int4 weights " \
                                 f"cannot absorb the merged W + BA; set {ARR}.rollout.lora_sync=adapters"


def test_a_plan_that_does_not_fit_is_printed_before_its_refusal(data_files, tmp_path):
    qwen7b = ROOT / "logicrl/memory/shapes/qwen2.5-7b"
    result = check_main(*data_files, *ON_80GB, f"{ARR}.model.path={qwen7b}", "data.train_batch_size=8",
                        f"{ARR}.rollout.n=8", "data.max_response_length=8192", "trainer.n_gpus=1",
                        f"{ARR}.model.enable_gradient_checkpointing=false", cwd=tmp_path)
    line = assert_refused(result, "GB usable per device")
    phase = line.removeprefix("error: ").split()[0]
    table = result.out[result.out.index("memory plan per device"):]
    assert any(row.startswith(phase) and row.rstrip().endswith("> capacity") for row in table.splitlines()), table


def test_a_quantization_package_missing_is_a_warning_in_a_dry_run_and_a_refusal_at_launch(data_files, monkeypatch,
                                                                                        caplog):
    import logicrl.config.quantization as quantization

    monkeypatch.setattr(quantization, "package_missing", lambda method: f"quantization={method} needs torchao, "
                                                                         "which is not installed")
    qlora = [*data_files, *BASE_BATCH, f"{ARR}.model.lora_rank=4", f"{ARR}.model.quantization=nf4"]
    with caplog.at_level(logging.WARNING, logger="logicrl.config"):
        validate(compose([*qlora, "trainer.dry_run=true"]))
    assert any("needs torchao, which is not installed (a launch here would refuse it)" in r.getMessage()
               for r in caplog.records)
    with pytest.raises(ConfigError, match="needs torchao, which is not installed$"):
        validate(compose(qlora))


def test_without_a_place_to_defer_them_a_dry_run_still_raises(data_files):
    # check_quantization called alone (no plan to print) refuses as a launch would.
    cfg, spec, _ = validate(compose([*data_files, *BASE_BATCH, *ON_80GB, f"{ARR}.model.path={GPTQ}",
                                     f"{ARR}.model.lora_rank=4", f"{ARR}.rollout.name=hf"]))
    cfg[ARR].rollout.lora_sync = "merged"
    with pytest.raises(ConfigError, match="lora_sync=merged with a gptq base"):
        check_quantization(cfg, spec)
