"""The models of a run: one row per FSDP2 model role, read by validation, the planner, the workers and the
trainer instead of re-typing each model's keys.

A row names the role's config keys (None where the role has no such knob: the reference and the reward
model never train, so they have no optimizer, learning rate or checkpointing). The actor and the reference
share `actor_rollout_ref.model` (one checkpoint, one packing switch); with LoRA the reference is the actor
with its adapter off. Adding a model role is adding a row here and the phases that run it (config/phases.py).
"""

from __future__ import annotations

from dataclasses import dataclass

from omegaconf import DictConfig, OmegaConf

from logicrl.config.phases import ARR

SP_KEY = "ulysses_sequence_parallel_size"


@dataclass(frozen=True)
class ModelRole:
    name: str  # the spelling config/phases.py's Phase.model uses
    prefix: str  # the role's own config group: its SP size, fsdp_config and optim sit under it
    path_key: str
    packing_key: str  # use_remove_padding: packed rows, no padding
    offload_key: str  # fsdp_config.param_offload
    trains: bool
    optim_offload_key: str | None = None
    ckpt_key: str | None = None  # enable_gradient_checkpointing
    lr_key: str | None = None

    @property
    def sp_key(self) -> str:
        return f"{self.prefix}.{SP_KEY}"

    def get(self, cfg: DictConfig, field: str):
        """The config value of this row's `field` key (e.g. "offload_key"); None where the row has none."""
        key = getattr(self, field)
        return None if key is None else OmegaConf.select(cfg, key, throw_on_missing=True)


MODELS = (
    ModelRole("actor", f"{ARR}.actor", f"{ARR}.model.path", f"{ARR}.model.use_remove_padding",
              f"{ARR}.actor.fsdp_config.param_offload", trains=True,
              optim_offload_key=f"{ARR}.actor.fsdp_config.optimizer_offload",
              ckpt_key=f"{ARR}.model.enable_gradient_checkpointing", lr_key=f"{ARR}.actor.optim.lr"),
    ModelRole("ref", f"{ARR}.ref", f"{ARR}.model.path", f"{ARR}.model.use_remove_padding",
              f"{ARR}.ref.fsdp_config.param_offload", trains=False),
    ModelRole("critic", "critic", "critic.model.path", "critic.model.use_remove_padding",
              "critic.fsdp_config.param_offload", trains=True,
              optim_offload_key="critic.fsdp_config.optimizer_offload",
              ckpt_key="critic.model.enable_gradient_checkpointing", lr_key="critic.optim.lr"),
    ModelRole("reward_model", "reward_model", "reward_model.model.path", "reward_model.model.use_remove_padding",
              "reward_model.model.fsdp_config.param_offload", trains=False),
)

BY_NAME = {m.name: m for m in MODELS}
TRAINED = tuple(m.name for m in MODELS if m.trains)


def model(name: str) -> ModelRole:
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"no model role {name!r}; the roles are {', '.join(BY_NAME)}") from None


def in_use(cfg: DictConfig) -> dict[str, bool]:
    """Which roles this run loads: the actor always, the reference for a KL term, the critic for GAE, the
    reward model when enabled."""
    arr = cfg[ARR]
    return {"actor": True, "ref": bool(arr.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward),
            "critic": cfg.algorithm.adv_estimator == "gae", "reward_model": bool(cfg.reward_model.enable)}
