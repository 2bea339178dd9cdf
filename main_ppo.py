"""logicrl entry point: compose -> validate -> preflight -> run.

    python main_ppo.py                                   # the embedded default: GRPO on a tiny model, CPU
    python main_ppo.py +recipe=stage1 trainer.n_gpus=4   # a Logic-RL phase
    python main_ppo.py trainer.dry_run=true              # validate and print the plan, load nothing
    python main_ppo.py +recipe=logic_rl                  # a staged curriculum (3 to 7 people), resumable

A config error is one line on stderr and exit code 2, before Ray or any model is touched; so is a
config whose memory plan (logicrl/memory/) does not fit the device.
"""

import hashlib
import re
import sys
from pathlib import Path

import hydra
from omegaconf import DictConfig, OmegaConf

from logicrl.config import ConfigError, check_overrides, validate
from logicrl.config.batching import check_batching
from logicrl.config.stages import build_stages, has_stages
from logicrl.config.summary import summarize
from logicrl.memory.preflight import apply_overrides, preflight

EXIT_CONFIG = 2
EXIT_OOM = 3  # out of memory with nothing left to halve; the last checkpoint is intact


def fail(err: ConfigError) -> None:
    print(f"error: {err}", file=sys.stderr)
    sys.exit(EXIT_CONFIG)


def job_dir_name(hydra_cfg) -> str:
    name = re.sub(r"[^A-Za-z0-9_.,=+-]", "_", hydra_cfg.job.override_dirname) or f"job{hydra_cfg.job.num}"
    if len(name) > 100:  # data paths make long names; keep them unique and short
        name = f"{name[:80]}-{hashlib.sha1(name.encode()).hexdigest()[:10]}"
    return name


@hydra.main(config_path="conf", config_name="ppo_trainer", version_base="1.3")
def main(cfg: DictConfig) -> None:
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    hydra_cfg = HydraConfig.get()
    if hydra_cfg.mode == RunMode.MULTIRUN:
        # Sweep jobs must not resume from each other's checkpoints: each combination gets its own
        # directory, named by its overrides, so re-running the sweep resumes every job from its own.
        cfg.trainer.default_local_dir = f"{cfg.trainer.default_local_dir}/{job_dir_name(hydra_cfg)}"
    try:
        if has_stages(cfg):
            # Every stage is composed and validated now, so stage 5's typo stops stage 1 from starting.
            stages = build_stages(cfg, list(hydra_cfg.overrides.task))
            runs = [(f"stage {s.index + 1}/{len(stages)}: {s.name}", s.cfg, s.spec, s.plan) for s in stages]
        else:
            stages = None
            runs = [("", *validate(cfg))]
        # The memory plan of every phase, before anything loads: refuse what cannot fit, or with
        # trainer.auto_micro_batch pick the largest micro-batches that do.
        tables = []
        for i, (title, run_cfg, spec, plan) in enumerate(runs):
            table, overrides = preflight(run_cfg, spec)
            if overrides:
                apply_overrides(run_cfg, overrides)
                plan = check_batching(run_cfg)
                runs[i] = (title, run_cfg, spec, plan)
                if stages:
                    stages[i].plan = plan
            tables.append(table)
    except ConfigError as err:
        fail(err)
    dry_run = runs[0][1].trainer.dry_run
    for (title, run_cfg, spec, plan), table in zip(runs, tables):
        if title:
            print(f"==== {title}")
        if dry_run:
            print(OmegaConf.to_yaml(run_cfg))
        print(summarize(run_cfg, spec, plan, table))
    if dry_run:
        return
    # Heavy imports (torch, Ray, transformers) only once the config is known to be good.
    from logicrl.logs import pin_ray_auth

    pin_ray_auth()  # before Ray is imported: it reads RAY_AUTH_MODE once (logicrl/logs.py)
    import ray

    from logicrl.workers.oom import OutOfMemoryAtMinimum

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
    except OutOfMemoryAtMinimum as err:
        # Raised on a rank and re-raised here by Ray (as a subclass of it): its first line is the message.
        cause = getattr(err, "cause", err)
        print(f"error: {str(cause).splitlines()[0]}", file=sys.stderr)
        sys.exit(EXIT_OOM)
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
