"""logicrl entry point: compose -> validate -> preflight -> run.

    python main_ppo.py                                   # the embedded default: GRPO on a tiny model, CPU
    python main_ppo.py +recipe=stage1 trainer.n_gpus=4   # a Logic-RL phase
    python main_ppo.py trainer.dry_run=true              # validate and print the plan, load nothing
    python main_ppo.py +recipe=logic_rl                  # a staged curriculum (3 to 7 people), resumable

A config error is one line on stderr and exit code 2, before Ray or any model is touched.
"""

import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from logicrl.config import ConfigError, check_overrides, validate
from logicrl.config.stages import build_stages, has_stages
from logicrl.config.summary import summarize

EXIT_CONFIG = 2


def fail(err: ConfigError) -> None:
    print(f"error: {err}", file=sys.stderr)
    sys.exit(EXIT_CONFIG)


@hydra.main(config_path="conf", config_name="ppo_trainer", version_base="1.3")
def main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig

    hydra_cfg = HydraConfig.get()
    try:
        if has_stages(cfg):
            # Every stage is composed and validated now, so stage 5's typo stops stage 1 from starting.
            stages = build_stages(cfg, list(hydra_cfg.overrides.task))
            runs = [(f"stage {s.index + 1}/{len(stages)}: {s.name}", s.cfg, s.spec, s.plan) for s in stages]
        else:
            stages = None
            runs = [("", *validate(cfg))]
    except ConfigError as err:
        fail(err)
    dry_run = runs[0][1].trainer.dry_run
    for title, stage_cfg, spec, plan in runs:
        if title:
            print(f"==== {title}")
        if dry_run:
            print(OmegaConf.to_yaml(stage_cfg))
        print(summarize(stage_cfg, spec, plan))
    if dry_run:
        return
    # Heavy imports (torch, Ray, transformers) only once the config is known to be good.
    import ray

    run_dir = Path(hydra_cfg.runtime.output_dir)
    try:
        if stages:
            from logicrl.trainer.curriculum import run_curriculum

            run_curriculum(stages, Path(cfg.trainer.default_local_dir), run_dir,
                           carry_optimizer=cfg.curriculum.carry_optimizer,
                           resume=cfg.trainer.resume_mode != "disable")
        else:
            from logicrl.trainer.ppo import PPOTrainer

            _, typed, _, plan = runs[0]
            PPOTrainer(typed, plan, run_dir).fit()
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
