"""What the memory plan reads from a validated config, as one flat frozen record.

The planner works on this record, not on the config, so `auto_micro_batch` can try other
micro-batch sizes with `dataclasses.replace` and nothing is mutated. `from_config` is the only
place that knows the config keys; `KNOBS` names the keys the suggestions may set.
"""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import DictConfig, OmegaConf

from logicrl.config.batching import ARR, uses_critic, uses_ref
from logicrl.memory.footprint import lora_targets
from logicrl.models.spec import ModelSpec

DTYPE_BYTES = {"bfloat16": 2, "float16": 2, "float32": 4}

# Suggestion keys, by what they control.
KNOBS = {
    "actor_micro": f"{ARR}.actor.ppo_micro_batch_size_per_gpu",
    "actor_budget": f"{ARR}.actor.ppo_max_token_len_per_gpu",
    "log_prob_micro": f"{ARR}.rollout.log_prob_micro_batch_size_per_gpu",
    "log_prob_budget": f"{ARR}.rollout.log_prob_max_token_len_per_gpu",
    "ref_micro": f"{ARR}.ref.log_prob_micro_batch_size_per_gpu",
    "ref_budget": f"{ARR}.ref.log_prob_max_token_len_per_gpu",
    "critic_micro": "critic.ppo_micro_batch_size_per_gpu",
    "critic_budget": "critic.ppo_max_token_len_per_gpu",
    "gen_micro": f"{ARR}.rollout.max_num_seqs",
    "gpu_memory_utilization": f"{ARR}.rollout.gpu_memory_utilization",
    "kv_cache_gb": f"{ARR}.rollout.kv_cache_gb",
    "actor_offload": f"{ARR}.actor.fsdp_config.param_offload",
    "ref_offload": f"{ARR}.ref.fsdp_config.param_offload",
    "critic_offload": "critic.fsdp_config.param_offload",
    "actor_ckpt": f"{ARR}.model.enable_gradient_checkpointing",
    "critic_ckpt": "critic.model.enable_gradient_checkpointing",
}


@dataclass(frozen=True)
class PlanInputs:
    spec: ModelSpec
    critic_spec: ModelSpec | None  # None: no critic (not gae)
    device: str  # "cuda" or "cpu": decides the dtype under "auto", and whether offload means anything
    dtype_bytes: int
    world: int  # FSDP ranks: every rank shards every model
    prompt_len: int
    response_len: int
    responses_per_rank: int
    # actor
    actor_micro: int | None  # None: packed to actor_budget tokens (use_dynamic_bsz)
    actor_budget: int | None
    actor_per_rank_mini: int
    actor_ckpt: bool
    actor_offload: bool
    lora_rank: int
    lora_targets: tuple[str, ...]
    skip_old_log_prob: bool
    log_prob_micro: int
    log_prob_budget: int | None
    # reference
    uses_ref: bool
    ref_micro: int
    ref_budget: int | None
    ref_offload: bool
    # critic
    critic_micro: int
    critic_budget: int | None
    critic_per_rank_mini: int
    critic_ckpt: bool
    critic_offload: bool
    # rollout
    engine: str  # "hf" or "vllm"
    gen_micro: int  # hf: sequences decoded together (max_num_seqs); vllm: max_num_seqs
    gpu_memory_utilization: float
    kv_cache_gb: float | None
    free_cache_engine: bool
    max_num_batched_tokens: int
    # what-ifs the config cannot express (docs/memory.md): a frozen 4-bit base, a reward model
    base_weight_bits: float | None = None
    reward_spec: ModelSpec | None = None
    update_weights_bucket_mb: int = 0  # weight sync gathers buckets of at most this (0: one tensor at a time)

    @property
    def width(self) -> int:
        """Padded sequence length of every micro-batch: the longest prompt plus the response cap."""
        return self.prompt_len + self.response_len

    @classmethod
    def from_config(cls, cfg: DictConfig, spec: ModelSpec, device: str, critic_spec: ModelSpec | None = None,
                    **what_if) -> "PlanInputs":
        arr, critic, ranks = cfg[ARR], cfg.critic, cfg.trainer.n_gpus
        n = arr.rollout.n
        dtype = arr.model.dtype
        dtype_bytes = DTYPE_BYTES[dtype] if dtype != "auto" else (2 if device == "cuda" else 4)
        actor_mini = min(arr.actor.ppo_mini_batch_size, cfg.data.train_batch_size)
        critic_mini = min(critic.ppo_mini_batch_size, cfg.data.train_batch_size)
        steps = cfg.data.train_batch_size // actor_mini * arr.actor.ppo_epochs
        dynamic = arr.actor.use_dynamic_bsz
        return cls(
            spec=spec, critic_spec=(critic_spec or spec) if uses_critic(cfg) else None, device=device,
            dtype_bytes=dtype_bytes, world=ranks,
            prompt_len=cfg.data.max_prompt_length, response_len=cfg.data.max_response_length,
            responses_per_rank=cfg.data.train_batch_size * n // ranks,
            actor_micro=None if dynamic else arr.actor.ppo_micro_batch_size_per_gpu,
            actor_budget=arr.actor.ppo_max_token_len_per_gpu if dynamic else None,
            actor_per_rank_mini=actor_mini * n // ranks,
            actor_ckpt=arr.model.enable_gradient_checkpointing, actor_offload=arr.actor.fsdp_config.param_offload,
            lora_rank=arr.model.lora_rank,
            lora_targets=lora_targets(arr.model.target_modules) if arr.model.lora_rank else (),
            # The trainer's rule (trainer/ppo.py): one optimizer step per step and no KL in the reward.
            skip_old_log_prob=steps == 1 and not cfg.algorithm.use_kl_in_reward,
            log_prob_micro=arr.rollout.log_prob_micro_batch_size_per_gpu,
            log_prob_budget=_budget(cfg, f"{ARR}.rollout", dynamic),
            uses_ref=uses_ref(cfg), ref_micro=arr.ref.log_prob_micro_batch_size_per_gpu,
            ref_budget=_budget(cfg, f"{ARR}.ref", dynamic),
            ref_offload=arr.ref.fsdp_config.param_offload,
            critic_micro=critic.ppo_micro_batch_size_per_gpu,
            critic_budget=critic.ppo_max_token_len_per_gpu if critic.use_dynamic_bsz else None,
            critic_per_rank_mini=critic_mini * n // ranks,
            critic_ckpt=critic.model.enable_gradient_checkpointing, critic_offload=critic.fsdp_config.param_offload,
            engine=arr.rollout.name, gen_micro=arr.rollout.max_num_seqs,
            gpu_memory_utilization=arr.rollout.gpu_memory_utilization, kv_cache_gb=arr.rollout.kv_cache_gb,
            free_cache_engine=arr.rollout.free_cache_engine,
            max_num_batched_tokens=arr.rollout.max_num_batched_tokens,
            update_weights_bucket_mb=arr.rollout.update_weights_bucket_mb,
            **what_if)


def _budget(cfg: DictConfig, section: str, actor_dynamic: bool) -> int | None:
    """A forward-only pass's token budget when it packs by tokens (`<section>.log_prob_use_dynamic_bsz`,
    following the actor's use_dynamic_bsz where a config predates the key), else None."""
    dynamic = OmegaConf.select(cfg, f"{section}.log_prob_use_dynamic_bsz", default=actor_dynamic)
    value = OmegaConf.select(cfg, f"{section}.log_prob_max_token_len_per_gpu", default=None)
    return int(value) if dynamic and value is not None else None
