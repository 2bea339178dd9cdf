"""The quantized-base checks, each a one-line ConfigError before any model, Ray or torch loads.

    check_quantization(cfg, spec, critic_spec)

- `actor_rollout_ref.model.quantization` without LoRA: a 4-bit base is frozen, so nothing would train;
- its package not installed (the quant extra, torchao), at launch: a dry run plans it without;
- a decoder Linear that the NF4 block does not divide;
- a pre-quantized checkpoint (config.json quantization_config): always without LoRA (full fine-tuning
  of int4 weights) or as the critic (trained in full). GPTQ loads (models/gptq.py) on an engine whose row
  holds it (config/engines.py: hf) with the adapter sync, once its packages are installed (the gptq extra,
  at launch); another method is refused. A dry run plans any of them (memory/planner_inputs.py reads its
  bits per weight) and hands these refusals to `defer`, said after its plan; a package missing is only a
  warning there, as the machine that launches may have it.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from omegaconf import DictConfig

from logicrl.config.engines import ENGINES
from logicrl.config.errors import ConfigError, log
from logicrl.config.plan import ARR
from logicrl.models.quant_methods import PRE_QUANTIZED, package_missing, pre_quantized_missing, pre_quantized_refusal
from logicrl.models.spec import ModelSpec


def linear_sizes(spec: ModelSpec) -> dict[str, int]:
    """Values in each decoder-layer Linear's weight (q, k/v, o, and the MLP's three)."""
    h, q, kv, i = spec.hidden_size, spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim, \
        spec.intermediate_size
    return {"q_proj": q * h, "k_proj": kv * h, "v_proj": kv * h, "o_proj": h * q, "gate_proj": i * h,
            "up_proj": i * h, "down_proj": h * i}


def check_quantization(cfg: DictConfig, spec: ModelSpec, critic_spec: ModelSpec | None = None,
                       defer: Callable[[str], None] | None = None) -> None:
    """Raises ConfigError; with trainer.dry_run and `defer`, what only stops a launch goes to `defer`."""
    dry = bool(cfg.trainer.dry_run) and defer is not None

    def refuse(line: str) -> None:
        if not dry:
            raise ConfigError(line)
        defer(line)

    model = cfg[ARR].model
    key = f"{ARR}.model.quantization"
    if critic_spec is not None and critic_spec.quant_method:
        raise ConfigError(f"critic.model.path={cfg.critic.model.path} is a pre-quantized {critic_spec.quant_method} "
                          "checkpoint: the critic trains every weight, which int4 weights cannot take; point it at "
                          "a bf16/fp32 checkpoint")
    if spec.quant_method:
        if model.lora_rank == 0:
            raise ConfigError(f"{ARR}.model.path={model.path} is a pre-quantized {spec.quant_method} checkpoint and "
                              f"{ARR}.model.lora_rank=0: int4 weights cannot be fine-tuned in full; train LoRA "
                              "adapters over it (lora_rank > 0)")
        if model.quantization:
            raise ConfigError(f"{key}={model.quantization} but {ARR}.model.path={model.path} is already quantized "
                              f"({spec.quant_method}): drop {key}")
        # A dry run plans it with the engine holding the int4 checkpoint, whatever runs it, then says these.
        if spec.quant_method not in PRE_QUANTIZED:
            return refuse(pre_quantized_refusal(f"{ARR}.model.path", model.path, spec.quant_method))
        rollout = cfg[ARR].rollout
        if spec.quant_method not in ENGINES[rollout.name].prequantized:
            holders = [name for name, row in ENGINES.items() if spec.quant_method in row.prequantized]
            refuse(f"{ARR}.rollout.name={rollout.name} with a {spec.quant_method} base ({model.path}): only the "
                   f"{' or '.join(holders)} engine holds it as the trainer does (the same int4 Linears, adapters "
                   f"synced alone); set {ARR}.rollout.name={holders[0]} (docs/quantization.md)")
        if rollout.lora_sync != "adapters":
            refuse(f"{ARR}.rollout.lora_sync={rollout.lora_sync} with a {spec.quant_method} base ({model.path}): "
                   f"int4 weights cannot absorb the merged W + BA; set {ARR}.rollout.lora_sync=adapters")
        if problem := pre_quantized_missing(spec.quant_method):
            if not dry:
                raise ConfigError(f"{ARR}.model.path={model.path}: {problem}")
            log.warning(f"{ARR}.model.path={model.path}: {problem} (a launch here would refuse it)")
        return
    if not model.quantization:
        return
    if model.lora_rank == 0:
        raise ConfigError(f"{key}={model.quantization} with {ARR}.model.lora_rank=0: a 4-bit base is frozen, so "
                          "nothing would train; set lora_rank > 0 (QLoRA), or drop the quantization to train every "
                          "weight")
    if problem := package_missing(model.quantization):
        if not cfg.trainer.dry_run:
            raise ConfigError(f"{ARR}.model.{problem}")
        log.warning(f"{ARR}.model.{problem} (a launch here would refuse it)")
    block = model.quantization_block_size
    for name, numel in linear_sizes(spec).items():
        if numel % block:
            raise ConfigError(f"{ARR}.model.quantization_block_size={block} does not divide {name}'s {numel:,} "
                              f"weights ({model.path}): use a divisor such as {math.gcd(numel, 64)}")
