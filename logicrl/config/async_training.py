"""Separate rollout and trainer groups (`actor_rollout_ref.hybrid_engine=false`): their keys, checked once.

verl's one-step-off keys size the two groups: `trainer.nnodes` x `trainer.n_gpus_per_node` ranks hold the
trained models (trainer.n_gpus, as in a colocated run), the top-level `rollout.nnodes` x
`rollout.n_gpus_per_node` hold only the engine. `async_training.max_staleness` bounds how many updates older
than the weights a batch trains from its generating weights may be: 0 reproduces the colocated run, 1 (the
default) overlaps generation of the next batch with this one's update. What is not implemented on two groups
yet is refused here, in one line, before anything starts.
"""

from __future__ import annotations

from omegaconf import DictConfig, OmegaConf

from logicrl.config.errors import ConfigError, log
from logicrl.config.phases import ARR

KEY = "async_training.max_staleness"


def separate_groups(cfg: DictConfig) -> bool:
    return not OmegaConf.select(cfg, f"{ARR}.hybrid_engine", default=True)


def rollout_ranks(cfg: DictConfig) -> int:
    """The rollout group's ranks; 0 for a colocated run (every rank generates)."""
    return cfg.rollout.nnodes * cfg.rollout.n_gpus_per_node if separate_groups(cfg) else 0


def staleness(cfg: DictConfig) -> int:
    """async_training.max_staleness as it applies (after `check_separate_groups` filled it in)."""
    value = OmegaConf.select(cfg, KEY, default=None)
    return int(value) if value is not None and separate_groups(cfg) else 0


def check_separate_groups(cfg: DictConfig) -> None:
    """Fill in max_staleness for separate groups and refuse what two groups cannot run (cfg normalised)."""
    at, corr = cfg.async_training, cfg.algorithm.rollout_correction
    if not separate_groups(cfg):
        if at.max_staleness:
            raise ConfigError(f"{KEY}={at.max_staleness} needs {ARR}.hybrid_engine=false (a colocated rank cannot "
                              "generate while it trains): set it, with rollout.n_gpus_per_node, or drop the key")
        if corr.bypass_mode is None:
            corr.bypass_mode = False
        return
    if at.max_staleness is None:
        at.max_staleness = 1
        log.info(f"derived: {KEY}=1 (one-step-off: the next batch generates while this one trains)")
    if corr.bypass_mode is None:
        # Stale samples need a trust region around the policy that sampled them. Decoupled correction clips
        # pi_theta / pi_old with pi_old the trainer's own policy at the update's start: with one optimizer step a
        # step that ratio is 1 and nothing is clipped (measured: the embedded run does not learn, docs/async.md).
        # Bypass clips pi_theta / pi_engine, as verl's one-step-off recipe sets it.
        corr.bypass_mode = at.max_staleness > 0
        if corr.bypass_mode:
            log.info(f"derived: algorithm.rollout_correction.bypass_mode=true ({KEY}={at.max_staleness}: the PPO "
                     "ratio is taken against the engine that sampled the batch, and clipped)")
    if at.max_staleness > 1:
        raise ConfigError(f"{KEY}={at.max_staleness}: one batch in flight is implemented (0 or 1); a deeper queue "
                          "would hold the trainer's sync behind the generation ahead of it: set 0 or 1")
    arr, ranks = cfg[ARR], rollout_ranks(cfg)
    prompts, n = cfg.data.train_batch_size, arr.rollout.n
    if (prompts * n) % ranks:
        raise ConfigError(f"data.train_batch_size={prompts} x {ARR}.rollout.n={n} = {prompts * n} responses do not "
                          f"split across rollout.nnodes x rollout.n_gpus_per_node = {ranks} rollout ranks: make the "
                          f"product a multiple of {ranks}")
    if arr.rollout.multi_turn.enable:
        raise ConfigError(f"{ARR}.rollout.multi_turn.enable=true with {ARR}.hybrid_engine=false: tool turns are not "
                          "implemented on separate groups yet (the rows' tools_kwargs do not travel to the rollout "
                          "ranks); set hybrid_engine=true or multi_turn.enable=false")
    if cfg.algorithm.filter_groups.enable:
        if at.max_staleness > 0:
            raise ConfigError(f"algorithm.filter_groups.enable=true with {KEY}={at.max_staleness}: dynamic sampling's "
                              "rounds are generated one after another as each is scored, none ahead; set "
                              f"{KEY}=0 (each round generates on the rollout group after the sync) or turn "
                              "filter_groups off")
    if at.max_staleness > 0:
        if corr.loss_type == "reinforce" and corr.rollout_is is None:
            raise ConfigError(f"algorithm.rollout_correction.loss_type=reinforce with rollout_is=null and {KEY}="
                              f"{at.max_staleness}: an unclipped, untruncated loss on stale samples (entropy "
                              "collapses); set rollout_is=token (truncated IS), loss_type=ppo_clip, or "
                              f"{KEY}=0")
        if corr.rollout_is is None and not corr.bypass_mode:
            log.warning(f"{KEY}={at.max_staleness} with algorithm.rollout_correction.rollout_is=null: stale samples "
                        "train without importance weights against the engine that sampled them (rollout_is=token "
                        "weights them, bypass_mode=true clips the ratio against that engine)")
