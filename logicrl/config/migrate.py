"""Older verl / Logic-RL keys mapped onto current ones, each with a one-line warning.

verl's first releases counted micro-batches globally (`ppo_micro_batch_size=64` over all ranks);
current verl and logicrl count them per rank. Run scripts from Logic-RL still use the old keys, so
they are converted here rather than rejected. A schema key logicrl does not act on is listed in
IGNORED_KEYS and warned about whenever it asks for something (tests/config/test_schema_truth.py
checks every other schema key is read by code); a key that changes behaviour is never dropped
silently. Keys verl has and the schema does not are handled before this, in verl_keys.py.
"""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from logicrl.config.errors import ConfigError, log

# (older global key, current per-rank key)
GLOBAL_MICRO_BATCH_KEYS = (
    ("actor_rollout_ref.actor.ppo_micro_batch_size", "actor_rollout_ref.actor.ppo_micro_batch_size_per_gpu"),
    ("actor_rollout_ref.rollout.log_prob_micro_batch_size",
     "actor_rollout_ref.rollout.log_prob_micro_batch_size_per_gpu"),
    ("actor_rollout_ref.ref.log_prob_micro_batch_size", "actor_rollout_ref.ref.log_prob_micro_batch_size_per_gpu"),
    ("critic.ppo_micro_batch_size", "critic.ppo_micro_batch_size_per_gpu"),
    ("reward_model.micro_batch_size", "reward_model.micro_batch_size_per_gpu"),
)

# Schema keys kept so verl and Logic-RL scripts run, that logicrl does not act on: (key, the value
# that asks for nothing, why any other value is ignored). The only table of such keys.
IGNORED_KEYS = (
    ("data.val_batch_size", None, "validation sends the whole set to the engine at once, which schedules "
                                  "rollout.max_num_seqs sequences at a time: the same results"),
    ("trainer.default_hdfs_dir", None, "logicrl writes checkpoints to trainer.default_local_dir only"),
)

RENAMED_KEYS = (
    ("custom_reward_function.path", "reward.custom.path"),
    ("custom_reward_function.name", "reward.custom.name"),
)


def migrate(cfg: DictConfig, n_ranks: int) -> None:
    """Rewrite deprecated keys in `cfg` (typed, resolved) in place; `n_ranks` is trainer.n_gpus."""
    for old, new in GLOBAL_MICRO_BATCH_KEYS:
        value = OmegaConf.select(cfg, old)
        if value is None:
            continue
        if value % n_ranks:
            raise ConfigError(
                f"{old}={value} is verl's older global micro-batch and does not split across "
                f"trainer.n_gpus={n_ranks} ranks: set {new} (per rank) instead")
        per_rank = value // n_ranks
        log.warning(f"{old}={value} is deprecated (global over {n_ranks} ranks): using {new}={per_rank}"
                    f" (replaces {OmegaConf.select(cfg, new)})")
        OmegaConf.update(cfg, new, per_rank)
        OmegaConf.update(cfg, old, None)

    for old, new in RENAMED_KEYS:
        value = OmegaConf.select(cfg, old)
        if value is not None:
            log.warning(f"{old} is deprecated: using it as {new}={value}")
            OmegaConf.update(cfg, new, value)
            OmegaConf.update(cfg, old, None)

    fsdp = cfg.actor_rollout_ref.actor.fsdp_config
    if fsdp.grad_offload is not None:
        # FSDP2's CPUOffloadPolicy moves a parameter's gradient with the parameter: there is no
        # separate gradient offload, so asking for it means offloading the parameters.
        if fsdp.grad_offload and not fsdp.param_offload:
            log.warning("actor_rollout_ref.actor.fsdp_config.grad_offload=true is deprecated: FSDP2 offloads "
                        "gradients with their parameters, so param_offload=true is set")
            fsdp.param_offload = True
        else:
            log.warning("actor_rollout_ref.actor.fsdp_config.grad_offload is deprecated and has no effect "
                        "beyond param_offload: ignored")
        fsdp.grad_offload = None

    for key, inert, why in IGNORED_KEYS:
        value = OmegaConf.select(cfg, key)
        if value != inert:
            log.warning(f"{key}={value} is ignored: {why}")
            OmegaConf.update(cfg, key, inert)

