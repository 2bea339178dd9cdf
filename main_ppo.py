"""logicrl entry point: compose -> validate (and plan) -> preflight -> run.

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

from logicrl.config import check_overrides, validate
from logicrl.config.stages import Stage, build_stages, has_stages
from logicrl.config.summary import summarize
from logicrl.errors import BadInput
from logicrl.memory.preflight import check_inputs, preflight

EXIT_CONFIG = 2
EXIT_OOM = 3  # out of memory with nothing left to halve; the last checkpoint is intact


def fail(err: BadInput) -> None:
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
        # Every stage is composed and validated now, so stage 5's typo stops stage 1 from starting.
        curriculum = has_stages(cfg)
        runs = build_stages(cfg, list(hydra_cfg.overrides.task)) if curriculum else [Stage(0, "", *validate(cfg))]
        # The memory plan of every phase, before anything loads: refuse what cannot fit, or with
        # trainer.auto_micro_batch pick the largest micro-batches that do (a new plan).
        tables = []
        for run in runs:
            table, run.plan = preflight(run.cfg, run.spec, run.plan)
            tables.append(table)
        # Data, model directories, device, directories and disk: every stage's, before any starts.
        for run in runs:
            check_inputs(run.cfg, run.spec, run.plan)
    except BadInput as err:
        fail(err)
    dry_run = runs[0].cfg.trainer.dry_run
    for run, table in zip(runs, tables):
        if curriculum:
            print(f"==== stage {run.index + 1}/{len(runs)}: {run.name}")
        if dry_run:
            print(OmegaConf.to_yaml(run.cfg))
        print(summarize(run.cfg, run.spec, run.plan, table))
    if dry_run:
        return
    # Heavy imports (torch, Ray, transformers) only once the config is known to be good.
    from logicrl.logs import pin_ray_auth

    pin_ray_auth()  # before Ray is imported: it reads RAY_AUTH_MODE once (logicrl/logs.py)
    import ray

    from logicrl.workers.oom import OutOfMemoryAtMinimum

    from logicrl.faults import Faults

    run_dir = Path(hydra_cfg.runtime.output_dir)
    faults = Faults.from_env()  # test-only fault injection, read once and passed down
    try:
        if curriculum:
            from logicrl.trainer.curriculum import run_curriculum

            run_curriculum(runs, Path(cfg.trainer.default_local_dir), run_dir,
                           carry_optimizer=cfg.curriculum.carry_optimizer,
                           resume=cfg.trainer.resume_mode != "disable", faults=faults)
        else:
            from logicrl.trainer.ppo import PPOTrainer

            PPOTrainer(runs[0].cfg, runs[0].plan, run_dir, faults=faults).fit()
    except BadInput as err:  # one the preflight could not see (e.g. a row past the sampled ones)
        fail(err)
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
        # Keys only today's verl has come back as ++key=value, so Hydra's struct mode lets them
        # through to validation, which maps, ignores or refuses each (config/verl_keys.py).
        sys.argv[1:] = check_overrides(sys.argv[1:])
    except BadInput as err:
        fail(err)
    main()
