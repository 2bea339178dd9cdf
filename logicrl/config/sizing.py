"""Is this run sized for the model and the device it will get? One line before training when it is not.

    line = sizing_note(cfg, spec, on_cpu)   # None, or "note: ..." for main_ppo to print before training

A note, not a refusal: the run goes on as asked (a user may mean to exercise a 7B recipe's code paths on
the stand-in). `python main_ppo.py +recipe=stage1 trainer.n_gpus=4` on a machine without GPUs otherwise
trains the embedded 0.5M-parameter model on 4,096-token puzzles for about 20 hours at accuracy 0, with
nothing saying why.
"""

from __future__ import annotations

from omegaconf import DictConfig

from logicrl.models.spec import ModelSpec
from logicrl.models.tiny import EMBEDDED_TINY

# What the embedded recipes use (conf/data: 4-token answers; tiny_curriculum's lr 2e-4, the default's
# 5e-4) is far from either bound; Logic-RL's stage recipes are past both (4096 tokens, lr 4e-7).
STAND_IN_MAX_RESPONSE = 256
STAND_IN_MIN_LR = 1e-5
# Past this on the CPU a step is minutes to hours (a forward and backward over every sampled token).
CPU_MAX_PARAMS = 100e6
INSTEAD = "`make train` or +recipe=tiny_curriculum for a CPU demo that learns in minutes"


def _real_model_settings(cfg: DictConfig) -> list[str]:
    """The settings that say a run was sized for a real model, as `key=value`."""
    out = []
    if (length := cfg.data.max_response_length) > STAND_IN_MAX_RESPONSE:
        out.append(f"data.max_response_length={length}")
    if (lr := cfg.actor_rollout_ref.actor.optim.lr) < STAND_IN_MIN_LR:
        out.append(f"actor_rollout_ref.actor.optim.lr={lr:g}")
    return out


def sizing_note(cfg: DictConfig, spec: ModelSpec, on_cpu: bool) -> str | None:
    """One line when a recipe sized for a real model runs on the embedded stand-in, or a large model runs on
    the CPU; None when the run is sized for what it gets."""
    path = cfg.actor_rollout_ref.model.path
    params = spec.num_params()
    if path == EMBEDDED_TINY and (settings := _real_model_settings(cfg)):
        return (f"note: this run is sized for a real model ({', '.join(settings)}) but actor_rollout_ref.model.path "
                f"is the embedded {params / 1e6:.1f}M-parameter stand-in, which cannot do it: set "
                f"actor_rollout_ref.model.path to a local checkpoint (Logic-RL used Qwen2.5-7B-Instruct-1M), or run "
                f"{INSTEAD}; going on as asked")
    if on_cpu and params > CPU_MAX_PARAMS:
        return (f"note: a {params / 1e9:.2f}B-parameter model on the CPU takes minutes to hours a step: run it on "
                f"GPUs (trainer.device=cuda trainer.n_gpus=N), or run {INSTEAD}; going on as asked")
    return None
