"""logicrl entry point: compose -> validate -> preflight -> run.

    python main_ppo.py                                   # the embedded default: GRPO on a tiny model, CPU
    python main_ppo.py +recipe=stage1 trainer.n_gpus=4   # a Logic-RL phase
    python main_ppo.py trainer.dry_run=true              # validate and print the plan, load nothing

A config error is one line on stderr and exit code 2, before Ray or any model is touched.
"""

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from logicrl.config import ConfigError, check_overrides, validate
from logicrl.config.summary import summarize

EXIT_CONFIG = 2


def fail(err: ConfigError) -> None:
    print(f"error: {err}", file=sys.stderr)
    sys.exit(EXIT_CONFIG)


@hydra.main(config_path="conf", config_name="ppo_trainer", version_base="1.3")
def main(cfg: DictConfig) -> None:
    try:
        cfg, spec, plan = validate(cfg)
    except ConfigError as err:
        fail(err)
    if cfg.trainer.dry_run:
        print(OmegaConf.to_yaml(cfg))
    print(summarize(cfg, spec, plan))
    if cfg.trainer.dry_run:
        return
    # Heavy imports (torch, Ray, transformers) only once the config is known to be good.
    import ray
    from hydra.core.hydra_config import HydraConfig

    from logicrl.trainer.ppo import PPOTrainer

    try:
        PPOTrainer(cfg, plan, Path(HydraConfig.get().runtime.output_dir)).fit()
    finally:
        # Multirun jobs share this process: each must start its own Ray cluster from scratch.
        if ray.is_initialized():
            ray.shutdown()


if __name__ == "__main__":
    try:
        check_overrides(sys.argv[1:])
    except ConfigError as err:
        fail(err)
    main()
