"""The models of a run: one row per FSDP2 model role, read by validation, the step plan, the memory
planner, the preflight, the workers and the trainer instead of re-typing each model's keys.

A row names the role's config keys (None where the role has no such knob: the reference and the reward
model never train, so they have no optimizer, learning rate or checkpointing) and when a run uses it.
The actor and the reference share `actor_rollout_ref.model` (one checkpoint, one packing switch); with
LoRA the reference is the actor with its adapter off. Adding a model role is adding a row here, the phases
that run it (config/phases.py) and the worker code that loads it.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from omegaconf import DictConfig, OmegaConf


@dataclass(frozen=True)
class ModelRole:
    name: str  # the spelling config/phases.py's Phase.model uses
    title: str  # how messages and the plan's attention line name it
    prefix: str  # the role's own config group: its batch sizes, fsdp_config and optim sit under it
    used: Callable[[DictConfig], bool]  # whether a run with this config loads the model
    path_key: str
    sp_key: str  # ulysses_sequence_parallel_size (models/ulysses.py)
    packing_key: str  # use_remove_padding: packed rows, no padding
    offload_key: str  # fsdp_config.param_offload
    trains: bool = False
    value_head: bool = False  # a scalar per token or row (critic, reward model), not the LM head's log-probs
    own_tokens: bool = False  # may read the policy's rows in its own tokenization (reward_model.model.input_tokenizer)
    optim_offload_key: str | None = None  # fsdp_config.optimizer_offload
    ckpt_key: str | None = None  # enable_gradient_checkpointing
    lr_key: str | None = None

    def get(self, cfg: DictConfig, field: str):
        """The config value of this row's `field` key (e.g. "offload_key"); None where the row has none."""
        key = getattr(self, field)
        return None if key is None else OmegaConf.select(cfg, key, throw_on_missing=True)

    def in_use(self, cfg: DictConfig) -> bool:
        return bool(self.used(cfg))


def _kl_term(cfg: DictConfig) -> bool:
    return bool(cfg.actor_rollout_ref.actor.use_kl_loss or cfg.algorithm.use_kl_in_reward)


# Keys written out whole, so a grep for a key finds its row.
MODELS = (
    ModelRole("actor", "actor", "actor_rollout_ref.actor", used=lambda cfg: True, trains=True,
              path_key="actor_rollout_ref.model.path",
              sp_key="actor_rollout_ref.actor.ulysses_sequence_parallel_size",
              packing_key="actor_rollout_ref.model.use_remove_padding",
              offload_key="actor_rollout_ref.actor.fsdp_config.param_offload",
              optim_offload_key="actor_rollout_ref.actor.fsdp_config.optimizer_offload",
              ckpt_key="actor_rollout_ref.model.enable_gradient_checkpointing",
              lr_key="actor_rollout_ref.actor.optim.lr"),
    # Only for a KL term; it is loaded from the actor's checkpoint and packs as the actor does.
    ModelRole("ref", "ref", "actor_rollout_ref.ref", used=_kl_term,
              path_key="actor_rollout_ref.model.path",
              sp_key="actor_rollout_ref.ref.ulysses_sequence_parallel_size",
              packing_key="actor_rollout_ref.model.use_remove_padding",
              offload_key="actor_rollout_ref.ref.fsdp_config.param_offload"),
    # Only GAE learns a value baseline.
    ModelRole("critic", "critic", "critic", used=lambda cfg: cfg.algorithm.adv_estimator == "gae", trains=True,
              value_head=True,
              path_key="critic.model.path",
              sp_key="critic.ulysses_sequence_parallel_size",
              packing_key="critic.model.use_remove_padding",
              offload_key="critic.fsdp_config.param_offload",
              optim_offload_key="critic.fsdp_config.optimizer_offload",
              ckpt_key="critic.model.enable_gradient_checkpointing",
              lr_key="critic.optim.lr"),
    ModelRole("reward_model", "reward model", "reward_model", used=lambda cfg: bool(cfg.reward_model.enable),
              value_head=True, own_tokens=True,
              path_key="reward_model.model.path",
              sp_key="reward_model.ulysses_sequence_parallel_size",
              packing_key="reward_model.model.use_remove_padding",
              offload_key="reward_model.model.fsdp_config.param_offload"),
)

BY_NAME = {m.name: m for m in MODELS}
TRAINED = tuple(m.name for m in MODELS if m.trains)


def model(name: str) -> ModelRole:
    try:
        return BY_NAME[name]
    except KeyError:
        raise KeyError(f"no model role {name!r}; the roles are {', '.join(BY_NAME)}") from None


def in_use(cfg: DictConfig) -> dict[str, bool]:
    """Which roles this run loads, by name: the actor always, the reference for a KL term, the critic for
    GAE, the reward model when enabled."""
    return {m.name: m.in_use(cfg) for m in MODELS}
