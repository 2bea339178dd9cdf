"""`actor_rollout_ref.rollout.name` -> the engine a rank builds: the one registry for that switch.

Each builder takes the resolved config, the rank's tokenizer, dtype and device, and the sequences
decoded at once (the step plan's generate micro-batch, config/plan.py: rollout.max_num_seqs unless
auto_micro_batch chose another), and returns a RolloutEngine holding its own copy of the policy
(synced from the actor after each update).
"""

from __future__ import annotations

import importlib.util
import logging

import torch
from omegaconf import DictConfig

from logicrl.memory.footprint import MIN_KV_CACHE_GB  # the floor the memory planner assumes too

log = logging.getLogger("logicrl.rollout")


def adapter_sync(cfg: DictConfig):
    """The run's LoRA as a LoraSpec when each sync sends only the adapters (rollout.lora_sync=adapters,
    lora_rank > 0), else None: no LoRA, or the merged sync."""
    from logicrl.models.loading import LoraSpec

    model = cfg.actor_rollout_ref.model
    if model.lora_rank == 0 or cfg.actor_rollout_ref.rollout.lora_sync != "adapters":
        return None
    targets = model.target_modules if isinstance(model.target_modules, str) else list(model.target_modules)
    return LoraSpec(model.lora_rank, model.lora_alpha, targets)


def _hf(cfg: DictConfig, tokenizer, dtype: torch.dtype, device: torch.device, max_num_seqs: int):
    from logicrl.models.gptq import to_device_keeping_buffers
    from logicrl.models.loading import load_causal_lm
    from logicrl.models.spec import load_model_spec
    from logicrl.workers.rollout.hf import HFRolloutEngine

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
    from logicrl.models.eos import eos_ids
    from logicrl.models.loading import checkpoint_dir

    return eos_ids(tokenizer, checkpoint_dir(cfg.actor_rollout_ref.model.path))


def kv_cache_gb(cfg: DictConfig, dtype: torch.dtype, device: torch.device, max_num_seqs: int) -> float | None:
    """The engine's KV cache budget: the configured one, else on CPU what max_num_seqs full sequences need."""
    from logicrl.models.spec import load_model_spec

    r = cfg.actor_rollout_ref.rollout
    if r.kv_cache_gb is not None or device.type == "cuda":
        return r.kv_cache_gb
    spec = load_model_spec(cfg.actor_rollout_ref.model.path)
    per_token = 2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * torch.finfo(dtype).bits // 8
    tokens = max_num_seqs * (cfg.data.max_prompt_length + cfg.data.max_response_length)
    return max(MIN_KV_CACHE_GB, per_token * tokens / 2**30)


def _vllm(cfg: DictConfig, tokenizer, dtype: torch.dtype, device: torch.device, max_num_seqs: int):
    from logicrl.models.loading import checkpoint_dir
    from logicrl.workers.rollout.vllm import VLLMRolloutEngine

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


ENGINES = {"hf": _hf, "vllm": _vllm}


def vllm_unavailable_reason() -> str | None:
    """None when vLLM imports here; otherwise why it does not."""
    if importlib.util.find_spec("vllm") is None:
        return "vLLM is not installed (pip install -e '.[cpu]' or '.[gpu]')"
    try:
        import vllm  # noqa: F401
    except Exception as err:  # a broken install (say, a CUDA wheel beside CPU torch) must not stop a run
        return f"importing vLLM failed ({type(err).__name__}: {err})"
    return None


def build_engine(cfg: DictConfig, tokenizer, dtype: torch.dtype, device: torch.device, max_num_seqs: int):
    name = cfg.actor_rollout_ref.rollout.name
    if name == "vllm":
        reason = vllm_unavailable_reason()
        if reason:
            # vllm is the default, so a machine without it still trains, with the engine it has.
            tp = cfg.actor_rollout_ref.rollout.tensor_model_parallel_size
            also = f" (each rank holding the whole model: tensor_model_parallel_size={tp} needs vLLM)" if tp > 1 else ""
            log.warning(f"actor_rollout_ref.rollout.name=vllm but {reason}: generating with hf instead{also}")
            name = "hf"
    return ENGINES[name](cfg, tokenizer, dtype, device, max_num_seqs)
