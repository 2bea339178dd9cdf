"""Ulysses sequence parallelism's keys (models/ulysses.py): what each model's group size must satisfy.

    ulysses_sequence_parallel_size  under actor_rollout_ref.actor, actor_rollout_ref.ref, critic, reward_model

One line each, before anything starts. A size S > 1 must divide trainer.n_gpus (groups of S consecutive
ranks; n_gpus / S data-parallel shares) and the model's attention heads (each rank attends with H / S of
them); its KV heads must be divisible by S, or S by them (each KV head is then replicated S / KV times: a
log line says so); the rows must be packed (use_remove_padding: the ranks split one packed row). Each model
has its own S (a phase's rows go to groups of its model's S, trainer/ppo.py), except that with LoRA the
reference is the actor with its adapter off, so it must have the actor's. Rollout is unaffected: every rank
generates its own rows (the hf engine too: it generates with its own copy of the model).
"""

from __future__ import annotations

from omegaconf import DictConfig

from logicrl.config.errors import ConfigError, log
from logicrl.config.models import MODELS, model
from logicrl.config.phases import phase as phase_row
from logicrl.models.spec import ModelSpec


def model_sp_sizes(cfg: DictConfig) -> dict[str, int]:
    """Each FSDP2 model's sequence-parallel group size, by its name in config/models.py."""
    return {m.name: m.get(cfg, "sp_key") for m in MODELS}


def phase_sp_size(cfg: DictConfig, phase: str) -> int:
    """Ranks that hold the same rows in `phase`: its model's SP size; 1 for generation (every rank its own)
    and for a phase without rows (update_weights)."""
    row = phase_row(phase)
    return 1 if row.rows_key is None else model_sp_sizes(cfg).get(row.model, 1)


def check_sequence_parallel(cfg: DictConfig, spec_of) -> None:
    """Raise ConfigError naming the key and the fix for an SP size the run cannot use. `spec_of(path_key)`
    gives the ModelSpec of the checkpoint a path key names."""
    actor, ref = model("actor"), model("ref")
    sizes = model_sp_sizes(cfg)
    if cfg.actor_rollout_ref.model.lora_rank > 0 and ref.in_use(cfg) and sizes["ref"] != sizes["actor"]:
        raise ConfigError(f"{ref.sp_key}={sizes['ref']} differs from {actor.sp_key}={sizes['actor']}, but with LoRA "
                          f"the reference is the actor with its adapter off (one model): set them equal")
    n_gpus = cfg.trainer.n_gpus
    for role in MODELS:
        size = sizes[role.name]
        if size == 1 or not role.in_use(cfg):
            continue
        if n_gpus % size:
            raise ConfigError(f"{role.sp_key}={size} must divide trainer.n_gpus={n_gpus} (each sequence-parallel "
                              f"group is {size} ranks): pick a divisor of {n_gpus}")
        if not role.get(cfg, "packing_key"):
            raise ConfigError(f"{role.sp_key}={size} splits packed rows across ranks: set {role.packing_key}=true")
        check_heads(role.sp_key, size, spec_of(role.path_key), role.path_key)


def check_heads(key: str, size: int, spec: ModelSpec, path_key: str) -> None:
    if spec.num_heads % size:
        raise ConfigError(f"{key}={size} must divide the model's num_attention_heads={spec.num_heads} ({path_key}): "
                          "each rank attends with an equal share of the heads; pick a divisor of it")
    kv = spec.num_kv_heads
    if kv % size and size % kv:
        raise ConfigError(f"{key}={size} must divide the model's num_key_value_heads={kv} or be a multiple of it "
                          f"({path_key}): pick such a size")
    if size > kv:
        log.info(f"{key}={size} > the model's {kv} key/value heads ({path_key}): each is replicated {size // kv} "
                 "times around attention (only K/V bytes in flight grow)")
