"""Can this run start? Everything checked before Ray or any model, for all of a run's stages at once.

    plans = preflight(stages)   # raises BadInput: main_ppo prints its one line and exits 2
    plans.stages[i].table, plans.stages[i].plan, plans.peaks_gb

The cheap and decisive checks come first: every model's weight files, read from their headers
(models.py), LoRA's target modules (lora.py: the planner sizes the adapters they pick), every
stage's memory plan (memory.py), then every stage's inputs (device.py, data.py and disk.py, then
models.py, whose tokenizer lets data.py tokenize the sampled prompts, and checkpoints.py: does the
one it resumes from fit, and is there anything left to train), so a later stage's bad data file stops
the first from starting. First of all, trainer.resume_mode=disable over another run's checkpoints.
The directories are made (disk.py) only once every stage passed: a refused run leaves nothing on
disk. Each stage is planned once; its StagePlan carries the numbers the later checks need. A dry run
keeps each stage's refusals on its StagePlan (validation's, memory's, the inputs') for main_ppo to say
after the plan; what only the launching machine knows (a package, weight files) is a warning there.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from omegaconf import DictConfig

from logicrl.config.stages import Stage
from logicrl.errors import BadInput
from logicrl.memory.phases import GB
from logicrl.memory.report import RunShape
from logicrl.preflight.checkpoints import check_checkpoint, check_fresh_start, check_not_done
from logicrl.preflight.data import check_data
from logicrl.preflight.device import check_device
from logicrl.preflight.disk import check_directories, checkpoint_bytes, create_directories
from logicrl.preflight.lora import check_lora
from logicrl.preflight.memory import StagePlan, check_memory
from logicrl.preflight.models import check_models, check_weights


@dataclass(frozen=True)
class Plans:
    """What the preflight decided: one StagePlan per stage, in the stages' order."""

    stages: tuple[StagePlan, ...]

    @property
    def peaks_gb(self) -> dict[str, float]:
        """Each phase's planned peak per device in GB, the largest over the stages."""
        return _largest(stage.peaks_gb for stage in self.stages)

    def peaks_gb_at(self, run: RunShape) -> dict[str, float]:
        """peaks_gb planned again for what a run's measured steps ran (preflight/memory.py peaks_gb_at)."""
        return _largest(stage.peaks_gb_at(run) for stage in self.stages)

    @property
    def capacity_gb(self) -> float:
        """GB per device the plans were checked against (the smallest over the stages)."""
        return min(stage.memory.capacity for stage in self.stages) / GB

    @property
    def device(self) -> str:
        return self.stages[0].memory.inputs.device


def _largest(per_stage) -> dict[str, float]:
    peaks: dict[str, float] = {}
    for stage in per_stage:
        for phase, gb in stage.items():
            peaks[phase] = max(peaks.get(phase, 0.0), gb)
    return peaks


def preflight(stages: Sequence[Stage]) -> Plans:
    """Every check of every stage, in the order above; raises BadInput at the first that fails.
    Each stage's `cfg` is validated, `spec` its actor's ModelSpec and `plan` its step plan; the
    plans to run are in the result (trainer.auto_micro_batch may have changed them)."""
    # A curriculum's stages (named) keep their checkpoints in <root>/<NN_name>: the run is the root.
    curriculum = bool(stages[0].name)
    root = Path(stages[0].cfg.trainer.default_local_dir)
    check_fresh_start(stages[0].cfg, root.parent if curriculum else root)
    for stage in stages:
        # Read from file headers in milliseconds; the memory plan may import transformers (a reward
        # model's tokenizer compared with the actor's).
        check_weights(stage.cfg, dry_run=stage.cfg.trainer.dry_run)
        check_lora(stage.cfg, stage.spec)  # the planner sizes the adapters it picks: none would break it
    plans = Plans(tuple(check_memory(stage.cfg, stage.spec, stage.plan) for stage in stages))
    checked = []
    for stage, planned in zip(stages, plans.stages):
        try:
            check_inputs(stage.cfg, planned, curriculum)
        except BadInput as err:
            if not stage.cfg.trainer.dry_run:
                raise
            planned = replace(planned, refusals=(*planned.refusals, err))  # said after the plan, as the others
        checked.append(planned)
    plans = Plans(tuple(checked))
    for stage in stages:
        create_directories(stage.cfg)
    return plans


def check_inputs(cfg: DictConfig, planned: StagePlan, curriculum: bool = False) -> None:
    """What one stage reads and writes: the device, data files, directories and disk, model
    directories, the checkpoint it would resume from. A dry run skips what needs the tokenizer.
    A curriculum's finished stages are its record's to judge (trainer/curriculum.py), not check_not_done's."""
    # What needs no transformers import first (a second or so), then the tokenizer's checks.
    check_device(cfg, planned.plan)
    check_data(cfg, None)
    check_directories(cfg, planned.plan, checkpoint_bytes(planned.memory.inputs, cfg.trainer.save_hf_model))
    tokenizer = check_models(cfg, dry_run=cfg.trainer.dry_run)
    # After the model checks: the comparison reads the model's config.json, which they vouched for.
    check_checkpoint(cfg)
    if not curriculum:
        check_not_done(cfg, planned.plan)
    if tokenizer is not None:
        check_data(cfg, tokenizer)
