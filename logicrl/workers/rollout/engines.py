"""`actor_rollout_ref.rollout.name` -> the engine a rank builds, by its row of config/engines.py.

Each row names its builder here. A builder takes the resolved config, the rank's tokenizer, dtype and
device, and the sequences decoded at once (the step plan's generate micro-batch, config/plan.py:
rollout.max_num_seqs unless auto_micro_batch chose another), and returns a RolloutEngine holding its own
copy of the policy (synced from the actor after each update).
"""

from __future__ import annotations

import logging

import torch
from omegaconf import DictConfig

from logicrl.config.engines import ENGINES, load, resolve_engine
from logicrl.memory.footprint import MIN_KV_CACHE_GB  # the floor the memory planner assumes too
from logicrl.models.eos import eos_ids
from logicrl.models.gptq import to_device_keeping_buffers
from logicrl.models.loading import LoraSpec, checkpoint_dir, load_causal_lm
from logicrl.models.spec import load_model_spec
from logicrl.workers.rollout.hf import HFRolloutEngine

# vllm.py imports vLLM itself only when an engine is built, so importing it here costs nothing without vLLM.
from logicrl.workers.rollout.vllm import VLLMRolloutEngine

log = logging.getLogger("logicrl.rollout")


def adapter_sync(cfg: DictConfig):
    """The run's LoRA as a LoraSpec when each sync sends only the adapters (rollout.lora_sync=adapters,
    lora_rank > 0), else None: no LoRA, or the merged sync."""
    model = cfg.actor_rollout_ref.model
    if model.lora_rank == 0 or cfg.actor_rollout_ref.rollout.lora_sync != "adapters":
        return None
    targets = model.target_modules if isinstance(model.target_modules, str) else list(model.target_modules)
    return LoraSpec(model.lora_rank, model.lora_alpha, targets)


def build_hf(cfg: DictConfig, tokenizer, dtype: torch.dtype, device: torch.device, max_num_seqs: int):
    arr = cfg.actor_rollout_ref
    # With the adapter sync the engine holds the base under its own peft adapters, which each sync
    # overwrites in place; .to(dtype) puts them in the compute dtype, as the actor gathers its own.
    model = load_causal_lm(arr.model.path, dtype, lora=adapter_sync(cfg))
    if load_model_spec(arr.model.path).quant_method == "gptq":  # the trainer's int4 base, buffers as stored
        model = to_device_keeping_buffers(model, device, dtype)
    else:
        model = model.to(device=device, dtype=dtype)
    model = model.eval().requires_grad_(False)
    return HFRolloutEngine(model, pad_id=tokenizer.pad_token_id, eos_ids=stop_ids(cfg, tokenizer),
                           micro_batch_size=max_num_seqs)


def stop_ids(cfg: DictConfig, tokenizer) -> list[int]:
    """The tokens that end a response: the tokenizer's eos and generation_config.json's (where chat
    models list their end-of-turn token), checked by the preflight (preflight/models.py)."""
    return eos_ids(tokenizer, checkpoint_dir(cfg.actor_rollout_ref.model.path))


def kv_cache_gb(cfg: DictConfig, dtype: torch.dtype, device: torch.device, max_num_seqs: int) -> float | None:
    """The engine's KV cache budget: the configured one, else on CPU what max_num_seqs full sequences need."""
    r = cfg.actor_rollout_ref.rollout
    if r.kv_cache_gb is not None or device.type == "cuda":
        return r.kv_cache_gb
    spec = load_model_spec(cfg.actor_rollout_ref.model.path)
    per_token = 2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * torch.finfo(dtype).bits // 8
    tokens = max_num_seqs * (cfg.data.max_prompt_length + cfg.data.max_response_length)
    return max(MIN_KV_CACHE_GB, per_token * tokens / 2**30)


def build_vllm(cfg: DictConfig, tokenizer, dtype: torch.dtype, device: torch.device, max_num_seqs: int):
    r = cfg.actor_rollout_ref.rollout
    if device.type == "cuda" and (device.index or 0) != 0:
        # vLLM 0.32's in-process engine takes its GPU from its device type alone ("cuda": the first
        # visible one); sharing GPU 0 with another rank's trainer would fail late, or oversubscribe it.
        raise RuntimeError(f"the vLLM engine can only use the first visible GPU, and this rank trains on {device}: "
                           "let Ray give each rank its own GPU (unset RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES), "
                           "or use actor_rollout_ref.rollout.name=hf")
    return VLLMRolloutEngine(
        str(checkpoint_dir(cfg.actor_rollout_ref.model.path)), pad_id=tokenizer.pad_token_id,
        eos_ids=stop_ids(cfg, tokenizer), max_model_len=cfg.data.max_prompt_length + cfg.data.max_response_length,
        dtype=str(dtype).removeprefix("torch."), seed=cfg.trainer.seed,
        gpu_memory_utilization=r.gpu_memory_utilization, kv_cache_gb=kv_cache_gb(cfg, dtype, device, max_num_seqs),
        max_num_seqs=max_num_seqs,
        max_num_batched_tokens=r.max_num_batched_tokens, enforce_eager=r.enforce_eager,
        enable_prefix_caching=r.enable_prefix_caching, free_cache_engine=r.free_cache_engine,
        tensor_model_parallel_size=r.tensor_model_parallel_size, lora=adapter_sync(cfg))


def build_engine(cfg: DictConfig, tokenizer, dtype: torch.dtype, device: torch.device, max_num_seqs: int):
    """The engine config/engines.py resolves for rollout.name (its fallback where the package does not
    import here, as the preflight planned it), built by its row's builder."""
    rollout = cfg.actor_rollout_ref.rollout
    engine = resolve_engine(rollout.name, rollout.tensor_model_parallel_size)
    if not engine.runs:
        raise RuntimeError(engine.line)
    if engine.reason:
        # vllm is the default, so a machine without it still trains, with the engine it has.
        log.warning(engine.line)
    return load(ENGINES[engine.name].builder)(cfg, tokenizer, dtype, device, max_num_seqs)
