"""What a run writes: its directories writable, and disk for its checkpoints.

    need = checkpoint_bytes(planned.memory.inputs, save_hf)   # one global_step_N/, from the memory plan
    check_directories(cfg, plan, need)   # raises ConfigError (exit 2); creates nothing
    create_directories(cfg)              # once every check of every stage passed

An unwritable trainer.default_local_dir would otherwise be found at the first save, which with
save_freq=-1 is after the whole run trained. The checks write a probe file in the nearest
directory that exists and make nothing, so a run refused later in the preflight (a model
directory without weights, say) leaves no empty checkpoint directory behind.
"""

from __future__ import annotations

import logging
import shutil
import tempfile
from pathlib import Path

from omegaconf import DictConfig

from logicrl.config.errors import ConfigError
from logicrl.config.plan import StepPlan
from logicrl.memory.footprint import FP32, ModelBytes
from logicrl.memory.planner_inputs import PlanInputs

log = logging.getLogger("logicrl.preflight")
# Decimal, as df -H and disk vendors count free space; the memory plan's GB (memory/phases.py) is 1024**3.
DISK_GB = 1e9
MARGIN = 1.1  # a real tiny checkpoint is 9% above the bare bytes (tests/bad_inputs/test_directories.py)


def checkpoint_bytes(x: PlanInputs, save_hf: bool) -> int:
    """One checkpoint on disk, all ranks together (workers/checkpoint.py writes it):
    the actor's weights (all of them, or only the LoRA adapters: the base reloads from
    model.path) with AdamW's two fp32 moments per trained parameter, the critic's likewise, and
    the HF export of the actor's full weights in the model dtype, plus MARGIN for what DCP adds
    (a tied embedding saved under both names, per-tensor records)."""
    actor = ModelBytes.build(x.spec, dtype_bytes=x.dtype_bytes, world=1, lora_rank=x.lora_rank,
                             lora_targets_=x.lora_targets)
    trained_params = actor.trainable_full // (FP32 if x.lora_rank else x.dtype_bytes)
    total = (actor.trainable_full if x.lora_rank else actor.total_full) + 2 * FP32 * trained_params
    if (critic_spec := x.models["critic"].spec) is not None:
        critic = ModelBytes.build(critic_spec, dtype_bytes=x.dtype_bytes, world=1, head="value")
        total += critic.total_full + 2 * FP32 * (critic.trainable_full // x.dtype_bytes)
    if save_hf:
        total += actor.total_full if x.lora_rank == 0 else (
            ModelBytes.build(x.spec, dtype_bytes=x.dtype_bytes, world=1).total_full + actor.trainable_full)
    return int(total * MARGIN)


def writable_problem(directory: Path, key: str, create: bool) -> str | None:
    """Why the run cannot write in `directory`, or None. Without `create` the probe goes in its nearest
    existing ancestor (the run would create the rest there); with it, `directory` is made and probed.
    A real write decides it: permission bits say nothing to root, nor about read-only mounts or quotas."""
    existing = directory
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        return f"{key}={directory}: {existing} is a file, not a directory: point {key} at a directory"
    target = directory if create else existing
    try:
        if create:
            directory.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=target, prefix=".logicrl-write-test-"):
            pass
    except OSError as err:
        return f"{key}={directory}: cannot write there ({err.strerror or err}): point {key} at a writable directory"
    return None


def check_directories(cfg: DictConfig, plan: StepPlan, need: int) -> None:
    """The checkpoint root and the run's output directory writable; room for one more checkpoint of
    `need` bytes (checkpoint_bytes). Creates nothing (create_directories does, after every check); a
    dry run only warns about disk."""
    t = cfg.trainer
    root = Path(t.default_local_dir)
    targets = [(root, "trainer.default_local_dir")]
    output = _output_dir()
    if output is not None:
        targets.append((output, "hydra.run.dir"))
    for directory, key in targets:
        if problem := writable_problem(directory, key, create=False):
            raise ConfigError(problem)
    existing = root
    while not existing.exists():
        existing = existing.parent
    free = shutil.disk_usage(existing).free
    if free < need:
        problem = (f"trainer.default_local_dir={root}: {size(free)} free, one checkpoint needs about "
                   f"{size(need)}: free disk there or point trainer.default_local_dir elsewhere")
        if not t.dry_run:
            raise ConfigError(problem)
        log.warning(problem)  # a dry run may plan, on a laptop, a run for a cluster's disks
        return
    # Old checkpoints are pruned after the new one commits: keeping k needs k + 1 at a time.
    keep = t.max_actor_ckpt_to_keep
    saves = 1 if t.save_freq == -1 else plan.total_steps // t.save_freq + 1  # the last step always saves
    held = min(saves, keep + 1) if keep is not None and keep >= 0 else saves
    if free < held * need:
        log.warning(f"trainer.default_local_dir={root}: {size(free)} free holds fewer than the {held} "
                    f"checkpoints of {size(need)} this run keeps at once: set trainer.max_actor_ckpt_to_keep "
                    "or free disk before the later saves")


def size(nbytes: float) -> str:
    """Bytes for a person: GB from one GB up, MB below (a tiny run's checkpoint is a few MB, and
    "0.0 GB free, needs 0.0 GB" says nothing), kB below one MB."""
    if nbytes >= DISK_GB:
        return f"{nbytes / DISK_GB:.1f} GB"
    if nbytes >= 1e6:
        return f"{nbytes / 1e6:.1f} MB"
    return f"{nbytes / 1e3:.0f} kB"


def create_directories(cfg: DictConfig) -> None:
    """Make trainer.default_local_dir (not in a dry run); raises ConfigError if it cannot be made there
    after all (a name too long for the file system, a race). Call it once every check has passed."""
    if cfg.trainer.dry_run:
        return
    if problem := writable_problem(Path(cfg.trainer.default_local_dir), "trainer.default_local_dir", create=True):
        raise ConfigError(problem)


def _output_dir() -> Path | None:
    """Hydra's run directory (it exists: Hydra made it before main started), when under Hydra."""
    try:
        from hydra.core.hydra_config import HydraConfig

        return Path(HydraConfig.get().runtime.output_dir) if HydraConfig.initialized() else None
    except (ImportError, ValueError):
        return None
