"""Normalising a typed config: the one step that changes values, each change logged once.

Everything here fills in what a config leaves to be derived, or clamps a knob that exceeds the
data; the `check_*` functions of validate.py and plan.py only check. It runs once per run (once
per curriculum stage), after migration and before the checks:

  trainer.n_gpus / n_gpus_per_node   the one not given, from the other and trainer.nnodes
  actor.clip_ratio_low / _high       trainer's symmetric clip_ratio where they are null
  trainer.logger                     a bare string (logger=wandb) as a one-item list
  *.ppo_mini_batch_size              clamped to data.train_batch_size (Logic-RL sets 256 against 8)
  *.ppo_micro_batch_size_per_gpu     clamped to the per-rank mini-batch it splits
"""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from logicrl.config.errors import ConfigError, log
from logicrl.config.models import MODELS
from logicrl.config.plan import ARR


def rank_count(cfg: DictConfig) -> int:
    """trainer.n_gpus as normalise() will set it; raises when the rank keys disagree."""
    t = cfg.trainer
    if t.n_gpus_per_node is not None:
        total = t.n_gpus_per_node * t.nnodes
        if t.n_gpus is not None and t.n_gpus != total:
            raise ConfigError(f"trainer.n_gpus={t.n_gpus} disagrees with trainer.n_gpus_per_node={t.n_gpus_per_node}"
                              f" x trainer.nnodes={t.nnodes} = {total}: set only one of them")
        ranks = total
    else:
        ranks = t.nnodes if t.n_gpus is None else t.n_gpus
    if ranks % t.nnodes:
        raise ConfigError(f"trainer.n_gpus={ranks} does not split across trainer.nnodes={t.nnodes}")
    return ranks


def normalize(cfg: DictConfig) -> None:
    """Fill in and clamp `cfg` (typed, migrated) in place; see the module docstring."""
    filled: list[str] = []

    def fill(section: DictConfig, prefix: str, key: str, value) -> None:
        if section[key] != value:
            filled.append(f"{prefix}.{key}={value}")
            section[key] = value

    t = cfg.trainer
    ranks = rank_count(cfg)
    fill(t, "trainer", "n_gpus", ranks)
    fill(t, "trainer", "n_gpus_per_node", ranks // t.nnodes)
    actor = cfg[ARR].actor
    for side in ("clip_ratio_low", "clip_ratio_high"):
        if actor[side] is None:
            fill(actor, f"{ARR}.actor", side, actor.clip_ratio)
    if isinstance(t.logger, str):  # verl scripts write both logger=wandb and logger=['wandb']
        t.logger = [t.logger]
        filled.append(f"trainer.logger={list(t.logger)}")
    if filled:
        log.info("derived: " + ", ".join(filled))

    for role in (m for m in MODELS if m.trains and m.in_use(cfg)):
        _clamp(cfg, role.prefix, OmegaConf.select(cfg, role.prefix))


def _clamp(cfg: DictConfig, prefix: str, role: DictConfig) -> None:
    prompts, n, ranks = cfg.data.train_batch_size, cfg[ARR].rollout.n, cfg.trainer.n_gpus
    if role.ppo_mini_batch_size > prompts:
        log.warning(f"{prefix}.ppo_mini_batch_size={role.ppo_mini_batch_size} > data.train_batch_size={prompts}: "
                    f"clamped to {prompts} (one optimizer step per epoch)")
        role.ppo_mini_batch_size = prompts
    per_rank_mini = role.ppo_mini_batch_size * n // ranks
    micro = role.ppo_micro_batch_size_per_gpu
    if not role.use_dynamic_bsz and per_rank_mini >= 1 and micro > per_rank_mini:
        log.warning(f"{prefix}.ppo_micro_batch_size_per_gpu={micro} > the {per_rank_mini} responses of a "
                    f"per-rank mini-batch: clamped to {per_rank_mini}")
        role.ppo_micro_batch_size_per_gpu = per_rank_mini
