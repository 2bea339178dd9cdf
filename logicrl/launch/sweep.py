"""Sweeps (`python main_ppo.py -m a=1,2 b=x,y`), with any Hydra launcher (basic, submitit_slurm).

- Each job's directory, and its checkpoint directory, is named by the values swept, not by its
  number: `rollout.n=4,train_batch_size=8`. Re-running or extending a sweep then resumes each job
  from its own checkpoints.
- Before the first job starts, every job is composed, validated and planned (`SweepCallback`),
  and the ones that cannot run are listed. None of them stops the sweep: each job records its own
  outcome (`result.json`), the invalid ones too, and the others run.
- At the end, `sweep_summary.md` and `sweep_summary.png` in the sweep directory have one row per
  job (launch/sweep_summary.py).

Which keys are swept is known only where the sweep is expanded (in the submitting process), not in
a job, which sees its own single values. The callback puts them in the environment
(LOGICRL_SWEPT_KEYS), which the jobs inherit: in-process under the basic launcher, and through
sbatch's default `--export=ALL` under submitit.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
from pathlib import Path
from typing import Any

from hydra.core.override_parser.overrides_parser import OverridesParser
from hydra.experimental.callback import Callback
from omegaconf import DictConfig, OmegaConf, open_dict

from logicrl.errors import BadInput
from logicrl.launch.sweep_summary import RESULT, write_summary

SWEPT_ENV = "LOGICRL_SWEPT_KEYS"
MAX_NAME = 100  # a directory name; long data paths are cut and made unique by a hash


def is_hydra_key(key: str) -> bool:
    return key == "hydra" or key.startswith(("hydra.", "hydra/"))


def swept_keys(overrides: list[str]) -> list[str]:
    """The keys given several values (`a=1,2`, `a=range(1,3)`, `a=choice(x,y)`), Hydra's own left out."""
    parsed = OverridesParser.create().parse_overrides(overrides)
    return [o.key_or_group for o in parsed if o.is_sweep_override() and not is_hydra_key(o.key_or_group)]


def short_names(keys: list[str]) -> dict[str, str]:
    """Each key's last two components, or more where two keys would read the same
    (actor.optim.lr and critic.optim.lr)."""
    names = {}
    for key in keys:
        parts = key.split(".")
        for n in range(min(2, len(parts)), len(parts) + 1):
            name = ".".join(parts[-n:])
            if not any(other != key and other.endswith(f".{name}") or other == name
                       for other in keys if other != key):
                break
        names[key] = name
    return names


def job_name(task: list[str], swept: list[str] | None) -> str:
    """A job's directory name from its overrides (`key=value`, as Hydra gives a sweep job): the
    swept ones, shortened; without a list of swept keys, every override but Hydra's."""
    pairs = []
    for arg in task:
        key, _, value = arg.lstrip("+~").partition("=")
        if not is_hydra_key(key) and (swept is None or key in swept):
            pairs.append((key, value))
    short = short_names([k for k, _ in pairs])
    name = re.sub(r"[^A-Za-z0-9_.,=+-]", "_", ",".join(f"{short[k]}={v}" for k, v in pairs)) or "job"
    if len(name) > MAX_NAME:
        name = f"{name[:MAX_NAME - 20]}-{hashlib.sha1(name.encode()).hexdigest()[:10]}"
    return name


def swept_from_env() -> list[str] | None:
    value = os.environ.get(SWEPT_ENV)
    return None if value is None else [k for k in value.split(",") if k]


def job_dir_name(task: Any, num: Any = None) -> str:
    """The OmegaConf resolver behind `hydra.sweep.subdir` (conf/ppo_trainer.yaml)."""
    return job_name([str(t) for t in task], swept_from_env())


def register_resolver() -> None:
    if not OmegaConf.has_resolver("logicrl_job_dir"):
        OmegaConf.register_new_resolver("logicrl_job_dir", job_dir_name)


def write_result(job_dir: Path, **result: Any) -> None:
    job_dir.mkdir(parents=True, exist_ok=True)
    (job_dir / RESULT).write_text(json.dumps(result, indent=1, default=str))


def check_job(cfg: DictConfig, task: list[str]) -> BadInput | None:
    """What main_ppo checks before anything loads (config, stages, memory plan), on one job's
    composed config; the bad input it would stop at, or None. Data and model directories are left
    to the job: they are the same for every job of most sweeps, and slower to read."""
    from logicrl.config import validate
    from logicrl.config.stages import Stage, build_stages, has_stages
    from logicrl.preflight.memory import check_memory

    try:
        stages = build_stages(cfg, task) if has_stages(cfg) else [Stage(0, "", *validate(cfg))]
        for stage in stages:
            check_memory(stage.cfg, stage.spec, stage.plan)
    except BadInput as err:
        return err
    return None


class SweepCallback(Callback):
    """Names the swept keys for the jobs, checks every job before the first starts, and writes the
    summary at the end. Runs in the submitting process, whatever the launcher."""

    def on_multirun_start(self, config: DictConfig, **kwargs: Any) -> None:
        task = list(config.hydra.overrides.task)
        os.environ[SWEPT_ENV] = ",".join(swept_keys(task))
        bad = self.check_all(config, task)
        if bad:
            lines = "\n".join(f"  {name}: {line}" for name, line in bad)
            print(f"logicrl sweep: {len(bad)} of {self.jobs} job(s) cannot run as given (each fails alone; "
                  f"the others run):\n{lines}", flush=True)

    def check_all(self, config: DictConfig, task: list[str]) -> list[tuple[str, str]]:
        from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
        from hydra.core.global_hydra import GlobalHydra

        parsed = OverridesParser.create().parse_overrides(task)
        combos = [list(c) for batch in BasicSweeper.split_arguments(parsed, None) for c in batch]
        self.jobs = len(combos)
        loader = GlobalHydra.instance().config_loader()
        swept = swept_from_env()
        bad = []
        # Each job says what it derives and clamps when it runs: here, only what stops one.
        quiet = logging.getLogger("logicrl")
        level, quiet.level = quiet.level, logging.ERROR
        try:
            for combo in combos:
                job_cfg = loader.load_sweep_config(config, combo)
                with open_dict(job_cfg):
                    del job_cfg["hydra"]
                if (err := check_job(job_cfg, combo)) is not None:
                    bad.append((job_name(combo, swept), f"error: {err}"))
        finally:
            quiet.level = level
        return bad

    def on_multirun_end(self, config: DictConfig, **kwargs: Any) -> None:
        global NOT_DONE
        NOT_DONE = write_summary(Path(config.hydra.sweep.dir))


NOT_DONE: int | None = None  # jobs of the last sweep that did not finish (main_ppo's exit code)
