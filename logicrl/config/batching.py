"""Batch arithmetic, verl's meaning: how a step's prompts split into responses, ranks,
mini-batches (optimizer steps) and micro-batches (forward/backward passes).

  data.train_batch_size                 prompts per step (global)
  rollout.n                             responses per prompt
  *.ppo_mini_batch_size                 prompts per optimizer step (global)
  *.ppo_micro_batch_size_per_gpu        responses per forward/backward on one rank
  *.log_prob_micro_batch_size_per_gpu   responses per forward-only pass on one rank

Checks that must hold are errors; knobs that only split work and exceed the data are clamped
with a warning (Logic-RL sets ppo_mini_batch_size=256 against a batch of 8 prompts).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from omegaconf import DictConfig

from logicrl.config.errors import ConfigError, log

ARR = "actor_rollout_ref"


@dataclass(frozen=True)
class UpdatePlan:
    """One trained role (actor or critic): its mini- and micro-batches on one rank."""

    mini_prompts: int
    per_rank_mini: int  # responses per optimizer step on one rank
    micro: int | None  # None: packed to a token budget (use_dynamic_bsz)
    ppo_epochs: int
    num_mini: int  # mini-batches per step

    @property
    def grad_accum(self) -> int | None:
        return None if self.micro is None else self.per_rank_mini // self.micro

    @property
    def optimizer_steps(self) -> int:
        return self.num_mini * self.ppo_epochs


@dataclass(frozen=True)
class BatchPlan:
    prompts: int
    n: int
    ranks: int
    actor: UpdatePlan
    critic: UpdatePlan | None  # only with a critic (gae)
    log_prob_micro: int
    ref_micro: int | None  # only with a reference (a KL term)

    @property
    def responses(self) -> int:
        return self.prompts * self.n

    @property
    def per_rank_responses(self) -> int:
        return self.responses // self.ranks

    def forwards(self, micro: int) -> int:
        """Forward-only passes per rank; the last micro-batch may be smaller."""
        return math.ceil(self.per_rank_responses / micro)


def uses_critic(cfg: DictConfig) -> bool:
    return cfg.algorithm.adv_estimator == "gae"


def uses_ref(cfg: DictConfig) -> bool:
    return bool(cfg[ARR].actor.use_kl_loss or cfg.algorithm.use_kl_in_reward)


def check_batching(cfg: DictConfig) -> BatchPlan:
    """Validate the batch arithmetic of a typed, resolved config (clamping in place) and plan it."""
    prompts, n, ranks = cfg.data.train_batch_size, cfg[ARR].rollout.n, cfg.trainer.n_gpus
    if (prompts * n) % ranks:
        raise ConfigError(
            f"data.train_batch_size={prompts} x {ARR}.rollout.n={n} = {prompts * n} responses do not split "
            f"across trainer.n_gpus={ranks} ranks: make the product a multiple of {ranks}")
    actor = _check_update(cfg, f"{ARR}.actor", cfg[ARR].actor, prompts, n, ranks)
    critic = _check_update(cfg, "critic", cfg.critic, prompts, n, ranks) if uses_critic(cfg) else None
    return BatchPlan(
        prompts=prompts, n=n, ranks=ranks, actor=actor, critic=critic,
        log_prob_micro=cfg[ARR].rollout.log_prob_micro_batch_size_per_gpu,
        ref_micro=cfg[ARR].ref.log_prob_micro_batch_size_per_gpu if uses_ref(cfg) else None,
    )


def _check_update(cfg: DictConfig, prefix: str, role: DictConfig, prompts: int, n: int, ranks: int) -> UpdatePlan:
    mini = role.ppo_mini_batch_size
    if mini > prompts:
        log.warning(f"{prefix}.ppo_mini_batch_size={mini} > data.train_batch_size={prompts}: "
                    f"clamped to {prompts} (one optimizer step per epoch)")
        mini = role.ppo_mini_batch_size = prompts
    if prompts % mini:
        raise ConfigError(f"{prefix}.ppo_mini_batch_size={mini} must divide data.train_batch_size={prompts}")
    if (mini * n) % ranks:
        raise ConfigError(
            f"{prefix}.ppo_mini_batch_size={mini} x {ARR}.rollout.n={n} = {mini * n} responses per mini-batch "
            f"do not split across trainer.n_gpus={ranks} ranks: make the product a multiple of {ranks}")
    per_rank_mini = mini * n // ranks
    micro = None if role.use_dynamic_bsz else role.ppo_micro_batch_size_per_gpu
    if micro is not None and micro > per_rank_mini:
        log.warning(f"{prefix}.ppo_micro_batch_size_per_gpu={micro} > the {per_rank_mini} responses of a "
                    f"per-rank mini-batch: clamped to {per_rank_mini}")
        micro = role.ppo_micro_batch_size_per_gpu = per_rank_mini
    if micro is not None and per_rank_mini % micro:
        raise ConfigError(
            f"{prefix}.ppo_micro_batch_size_per_gpu={micro} must divide the per-rank mini-batch of "
            f"{per_rank_mini} responses ({prefix}.ppo_mini_batch_size={mini} x rollout.n={n} / "
            f"trainer.n_gpus={ranks}): use a divisor of {per_rank_mini}, or {prefix}.use_dynamic_bsz=true")
    return UpdatePlan(mini_prompts=mini, per_rank_mini=per_rank_mini, micro=micro,
                      ppo_epochs=role.ppo_epochs, num_mini=prompts // mini)
