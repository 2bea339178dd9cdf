"""The eval group's keys (conf/eval/default.yaml): their checks and the sampling they ask for.

    n, params = eval_sampling(cfg)   # responses per problem, the engine's sampling parameters

eval.n and eval.temperature default to rollout.val_kwargs (verl's keys), so a verl run script validates as
before; setting eval.temperature also sets do_sample (0: greedy), one key instead of verl's two.
"""

from __future__ import annotations

from omegaconf import DictConfig, ListConfig, OmegaConf

from logicrl.config.errors import ConfigError
from logicrl.config.plan import ARR


def eval_sampling(cfg: DictConfig) -> tuple[int, dict]:
    """(responses per problem, sampling parameters) of validation: eval.n / eval.temperature where set,
    else rollout.val_kwargs as verl reads them (greedy unless do_sample)."""
    vk, ev = cfg[ARR].rollout.val_kwargs, cfg.eval
    params = dict(temperature=vk.temperature, top_p=vk.top_p, top_k=vk.top_k, do_sample=vk.do_sample)
    if ev.temperature is not None:
        params.update(temperature=float(ev.temperature), do_sample=ev.temperature > 0)
    return int(ev.n if ev.n is not None else vk.n), params


def check_eval(cfg: DictConfig) -> None:
    """eval.k within 1..n; eval.checkpoints a list, only with trainer.val_only and no curriculum."""
    n, _ = eval_sampling(cfg)
    ks = cfg.eval.k
    if not isinstance(ks, ListConfig) or not ks or not all(isinstance(k, int) and not isinstance(k, bool) for k in ks):
        raise ConfigError(f"eval.k={OmegaConf.to_container(ks) if OmegaConf.is_config(ks) else ks} must be a "
                          "non-empty list of integers, e.g. eval.k=[1,4]")
    if bad := [k for k in ks if not 1 <= k <= n]:
        raise ConfigError(f"eval.k holds {bad}, outside 1..{n} (eval.n, else rollout.val_kwargs.n, responses per "
                          f"problem): raise eval.n to {max(bad)} or drop them")
    points = cfg.eval.checkpoints
    if not isinstance(points, ListConfig):
        raise ConfigError(f"eval.checkpoints={points!r} must be a list of paths, e.g. eval.checkpoints=[A,B]")
    if points and not cfg.trainer.val_only:
        raise ConfigError("eval.checkpoints evaluates checkpoints without training: add +recipe=eval_math "
                          "(or trainer.val_only=true), or drop eval.checkpoints")
    if points and OmegaConf.select(cfg, "curriculum.stages"):
        raise ConfigError("eval.checkpoints and curriculum.stages do not go together: evaluate a curriculum's "
                          "stages by their checkpoint directories in eval.checkpoints, without the curriculum")
