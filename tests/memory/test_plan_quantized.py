"""The plan of a frozen 4-bit base under LoRA: its bytes by hand, NF4 from the config, a GPTQ
checkpoint from its config.json, and TRL's GPTQ QLoRA run (GRPO, Qwen2.5-7B-GPTQ-int4, vLLM at 0.2 of
2 x 40 GB) planned from logicrl/memory/shapes/qwen2.5-7b-gptq-int4 (docs/memory.md has the table)."""

from dataclasses import replace

import pytest

from logicrl.config import ConfigError, compose, validate
from logicrl.config.phases import ARR
from logicrl.memory.footprint import ModelBytes, dequant_bytes
from logicrl.memory.phases import GB
from logicrl.memory.planner import build_models, plan_inputs
from logicrl.memory.planner_inputs import PlanInputs
from logicrl.models.spec import load_model_spec
from tests.conftest import BASE_BATCH
from tests.memory.conftest import planned

GPTQ = "logicrl/memory/shapes/qwen2.5-7b-gptq-int4"
# Qwen2.5-7B's decoder Linears, one layer: q and o 3584 x 3584, k and v 512 x 3584, gate/up/down 18944 x 3584.
LINEAR_WEIGHTS = 2 * 3584 * 3584 + 2 * 512 * 3584 + 3 * 18944 * 3584
assert LINEAR_WEIGHTS == 233_046_016
# Embedding and untied lm_head (152064 x 3584 each), final norm; per layer 2 norms and q/k/v biases.
BF16_REST = 2 * (2 * 152064 * 3584 + 3584 + 28 * (2 * 3584 + 3584 + 512 + 512))
# TRL's GPTQ QLoRA run's settings: GRPO, 2 GPUs, vLLM at gpu_memory_utilization 0.2 and max_model_len 2500
# (prompt 512 + response 1988 here), per-device batch 2 and 2 generations per prompt, KL to the reference.
TRL_GPTQ_RUN = ["trainer.n_gpus=2", "trainer.gpu_memory_gb=40", "trainer.device=cuda", "algorithm.adv_estimator=grpo",
            f"{ARR}.rollout.name=vllm", f"{ARR}.rollout.gpu_memory_utilization=0.2", "data.max_prompt_length=512",
            "data.max_response_length=1988", f"{ARR}.rollout.n=2", "data.train_batch_size=2",
            f"{ARR}.actor.ppo_mini_batch_size=2", f"{ARR}.actor.ppo_micro_batch_size_per_gpu=2",
            f"{ARR}.ref.log_prob_micro_batch_size_per_gpu=2", f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu=2",
            f"{ARR}.model.lora_rank=16", f"{ARR}.model.lora_alpha=32", f"{ARR}.actor.use_kl_loss=true",
            f"{ARR}.model.enable_gradient_checkpointing=true"]


def inputs(data, *overrides) -> PlanInputs:
    return planned(*data, *BASE_BATCH, *overrides, device="cuda" if "trainer.device=cuda" in overrides else "cpu")[3]


def test_a_gptq_engine_copy_by_hand():
    spec = load_model_spec(GPTQ)
    engine = ModelBytes.build(spec, dtype_bytes=2, world=1, base_weight_bits=4.15625)
    assert engine.total_full == int(28 * LINEAR_WEIGHTS * 4.15625 / 8) + BF16_REST
    assert engine.total_full / 1e9 == pytest.approx(5.571, abs=1e-3)  # against 15.23 GB in bf16
    # torchao's dequantize of the widest Linear (18944 x 3584): int64 nibbles + 3 bf16 copies, 14 B a weight.
    assert dequant_bytes(spec, 2) == 14 * 18944 * 3584


def test_a_replicated_base_holds_its_linears_whole_on_every_rank():
    spec = load_model_spec(GPTQ)
    kwargs = {"dtype_bytes": 2, "world": 2, "lora_rank": 16, "lora_targets_": ("q_proj", "v_proj"),
              "base_weight_bits": 4.0}
    sharded = ModelBytes.build(spec, **kwargs)
    replicated = ModelBytes.build(spec, **kwargs, base_replicated=True)
    # Every dim 0 is even: a shard is half of each Linear, and the replicated base adds the other half.
    assert replicated.total_shard - sharded.total_shard == 28 * LINEAR_WEIGHTS * 4 // 8 // 2
    assert replicated.trainable_shard == sharded.trainable_shard  # the adapters are sharded either way


def test_nf4_from_the_config(data):
    x = inputs(data, f"{ARR}.model.lora_rank=4", f"{ARR}.model.quantization=nf4", "trainer.dry_run=true")
    assert x.base_weight_bits == 4 + 8 / 64 + 8 * 4 / (64 * 256)  # fp32 on CPU: fp32 scaler factors
    assert x.base_replicated and x.engine_full_precision  # the engine loads the bf16 checkpoint
    m = build_models(x)
    assert m.actor.dequant_transient == (8 + 3 * 4) * 352 * 128  # the tiny MLP's widest Linear, fp32
    assert m.engine.dequant_transient == 0 and m.engine.total_full == build_models(
        replace(x, base_weight_bits=None)).engine.total_full


def test_seed_004_fits_with_an_int4_engine_and_not_with_bf16_weights_sent(data):
    x = inputs(data, f"{ARR}.model.path={GPTQ}", "trainer.dry_run=true", *TRL_GPTQ_RUN)
    assert (x.base_weight_bits, x.base_replicated, x.engine_full_precision) == (4.15625, True, False)
    plan = plan_inputs(x, 40 * GB)
    assert max(p.total for p in plan.running()) <= plan.usable
    generate = plan.phase("generate")
    # vLLM's 0.2 x 40 GB = 8 GB share: the int4 weights (5.57 GB) and its activation reserve (generate's
    # activations: room its forwards use, not held between rollouts), the rest KV.
    assert generate.parts["engine"] == 5570747392
    assert generate.parts["engine"] + generate.parts["activations"] + generate.parts["kv_cache"] == int(0.2 * 40 * GB)
    assert generate.parts["kv_cache"] > 2 * 2500 * 2 * 28 * 4 * 128 * 2  # both rows' 2500 tokens of K and V
    # An engine re-sent the merged bf16 weights needs them in its share: 15.2 GB of weights, no KV cache left.
    merged = plan_inputs(replace(x, engine_full_precision=True), 40 * GB)
    assert merged.phase("generate").parts["engine"] > int(0.2 * 40 * GB)
    assert merged.phase("generate").parts["kv_cache"] == 0


def test_a_gptq_checkpoint_is_refused_at_launch_where_it_cannot_run_in_one_line(data, monkeypatch, tmp_path):
    import importlib.util
    import json
    import shutil

    grpo = [*data, *BASE_BATCH, "algorithm.adv_estimator=grpo"]  # a critic would train every (int4) weight
    lora = [*grpo, f"{ARR}.model.path={GPTQ}", f"{ARR}.model.lora_rank=4"]
    with pytest.raises(ConfigError, match="rollout.name=hf") as e:  # that run's vLLM
        validate(compose([*lora, f"{ARR}.rollout.name=vllm"]))
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="lora_sync=adapters") as e:
        validate(compose([*lora, f"{ARR}.rollout.name=hf", f"{ARR}.rollout.lora_sync=merged"]))
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "gptqmodel" else real(name, *a))
    with pytest.raises(ConfigError, match=r"not installed: gptqmodel.*; pip install 'logicrl\[gptq\]'") as e:
        validate(compose([*lora, f"{ARR}.rollout.name=hf"]))
    assert "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="lora_rank=0"):
        validate(compose([*grpo, f"{ARR}.model.path={GPTQ}", "trainer.dry_run=true"]))
    # Another method (AWQ here) is refused at launch, pointing at NF4 over the bf16 checkpoint.
    awq = tmp_path / "awq"
    shutil.copytree(GPTQ, awq)
    config = json.loads((awq / "config.json").read_text())
    config["quantization_config"]["quant_method"] = "awq"
    (awq / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="loads gptq checkpoints only") as e:
        validate(compose([*grpo, f"{ARR}.model.path={awq}", f"{ARR}.model.lora_rank=4"]))
    assert "quantization=nf4" in str(e.value)


# The tiny model's decoder Linears, one layer: q and o 128 x 128, k and v 64 x 128, gate/up/down 352 x 128.
TINY_LINEARS = 2 * 128 * 128 + 2 * 64 * 128 + 3 * 352 * 128
# LoRA r=4 on all of them (all-linear), one layer: A [4, in] + B [out, 4] each.
TINY_ADAPTERS = 2 * (4 * 128 + 128 * 4) + 2 * (4 * 128 + 64 * 4) + 2 * (4 * 128 + 352 * 4) + (4 * 352 + 128 * 4)


def test_the_sync_row_models_the_stream_lora_sync_sends(data):
    """fp32 on one CPU rank: the adapter sync holds its adapters' copies (vLLM collects them all); over
    an NF4 base the plan also has the base sent once at build (each Linear dequantized: a new tensor,
    all of them under the 512 MB bucket, plus torchao's dequantize transient), the awake engine beside it."""
    from logicrl.memory.planner import resident

    lora = (f"{ARR}.model.lora_rank=4", "trainer.dry_run=true")
    x = inputs(data, *lora)
    assert (x.lora_sync, x.world, x.dtype_bytes, x.engine) == ("adapters", 1, 4, "vllm")
    held = resident(x, build_models(x))[0]
    row = plan_inputs(x, 8 * GB).phase("update_weights")
    assert row.moment == "adapters" and row.parts["params"] == held + 2 * TINY_ADAPTERS * 4
    merged = plan_inputs(replace(x, lora_sync="merged"), 8 * GB).phase("update_weights")
    assert merged.parts["params"] > row.parts["params"]

    q = inputs(data, *lora, f"{ARR}.model.quantization=nf4")
    held = resident(q, build_models(q))[0]
    plan = plan_inputs(q, 8 * GB)
    # Each step's sync (what perf/memory/update_weights measures): the adapters, as over a bf16 base.
    assert plan.phase("update_weights").parts["params"] == held + 2 * TINY_ADAPTERS * 4
    once = plan.base_once  # the moment at build, before the first step
    assert once.moment == "the 4-bit base once, at build"
    assert once.parts["params"] == held + 2 * TINY_LINEARS * 4 + (8 + 3 * 4) * 352 * 128
    assert once.parts["engine"] == plan.phase("generate").parts["engine"]  # awake, as it generates
    assert any("the dequantized 4-bit base once, at build" in note for note in plan.notes)
    assert plan_inputs(replace(q, lora_sync="merged"), 8 * GB).base_once is None
