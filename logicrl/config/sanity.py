"""Values that type-check and are in range one by one, yet cannot work together or point somewhere wrong.

Each check refuses in one line before anything starts: where the run writes (inside the output tree),
bounds that must be ordered. The rejection bounds of rollout correction are algos/rollout_correction.py's
own (`parse_rejection`), which validate.py calls; this module holds the rest.
"""

from __future__ import annotations

from pathlib import PurePosixPath

from omegaconf import DictConfig

from logicrl.config.errors import ConfigError
from logicrl.config.phases import ARR


def check_output_names(trainer: DictConfig) -> None:
    """project_name and experiment_name name directories under outputs/ and checkpoints/ (conf/ppo_trainer.yaml,
    conf/trainer/default.yaml): a name that climbs out of that tree (`../../x`, `/abs`) would write a run's
    logs and checkpoints somewhere else. default_local_dir may be anywhere, but not empty: an empty one
    writes checkpoints into the launch directory."""
    for key in ("project_name", "experiment_name"):
        name = str(trainer[key])
        parts = PurePosixPath(name).parts
        if not name.strip() or name.startswith(("/", "~")) or ".." in parts:
            raise ConfigError(f"trainer.{key}={name!r} must be a plain name inside the output tree (outputs/, "
                              f"checkpoints/): no '..', no leading '/' or '~'; to write elsewhere set "
                              "trainer.default_local_dir and hydra.run.dir")
    if not str(trainer.default_local_dir or "").strip():
        raise ConfigError("trainer.default_local_dir is empty, which would write checkpoints into the launch "
                          "directory: give it a directory (its default is checkpoints/<project_name>/"
                          "<experiment_name>)")


def check_clip_cov(cfg: DictConfig) -> None:
    """Clip-Cov's band (algos/policy_loss_cov.py): tokens whose covariance lies in (clip_cov_lb, clip_cov_ub)
    are the candidates; reversed bounds leave none, and the loss is plain PPO without a word."""
    loss = cfg[ARR].actor.policy_loss
    if loss.clip_cov_lb > loss.clip_cov_ub:
        key = f"{ARR}.actor.policy_loss"
        raise ConfigError(f"{key}.clip_cov_lb={loss.clip_cov_lb} > {key}.clip_cov_ub={loss.clip_cov_ub}: the band "
                          "of covariances Clip-Cov clips is empty; swap them (verl's defaults are 1 and 5)")
