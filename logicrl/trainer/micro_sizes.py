"""Micro-batch sizes halved by an OOM that ended the run, kept for the run that resumes it.

    <trainer.default_local_dir>/micro_sizes.json    {"format": 1, "sizes": {config key: value}}

An OOM on one rank inside an FSDP2 phase ends the run rather than hang the others
(docs/faults.md explains why). The failing rank halves its micro-batch (or token budget)
and raises RankOutOfMemory; the trainer writes the halved value here, beside the checkpoints the
run resumes from, and ends with OutOfMemoryOnRank (main_ppo: exit 4, one line). A run that
resumes (trainer.resume_mode other than disable) reads the file before its workers start and caps
the plan's values at the saved ones, with a warning per key; every rank then builds its micro-batches
from the same plan, so their counts agree, and the value shows as perf/micro_size/<phase>. A saved
value only ever lowers the config's: a later OOM lowers it again, a larger config value is capped.
Deleting the file goes back to the config's values.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import TYPE_CHECKING

from logicrl.config.plan import StepPlan
from logicrl.trainer.checkpoint import newest_resumable, write_durably
from logicrl.workers.oom import RankOutOfMemory

if TYPE_CHECKING:  # imports Ray, which the trainer does not need to run (tests/gpu/local_group.py)
    from logicrl.controller.worker_group import WorkerFailed

log = logging.getLogger("logicrl.trainer")
SIZES_FILE = "micro_sizes.json"
SIZES_FORMAT = 1


class OutOfMemoryOnRank(RuntimeError):
    """The run ended because a rank ran out of memory inside an FSDP2 phase; the line says which,
    where the halved value is kept and which checkpoint the re-run resumes from."""


def read_saved(root: str | Path) -> dict[str, int]:
    """{config key: value} saved under `root`, or {} when there is no file."""
    path = Path(root) / SIZES_FILE
    if not path.is_file():
        return {}
    data = json.loads(path.read_text())
    if data.get("format") != SIZES_FORMAT:
        raise ValueError(f"{path} has format {data.get('format')}, this logicrl reads {SIZES_FORMAT}: delete it")
    return {k: int(v) for k, v in data["sizes"].items()}


def save_halved(root: str | Path, key: str, value: int) -> Path:
    """Keep `key`=`value` under `root` (the smaller, if a value is already kept); returns the file."""
    root = Path(root)
    root.mkdir(parents=True, exist_ok=True)
    sizes = read_saved(root)
    sizes[key] = min(value, sizes.get(key, value))
    write_durably(root / SIZES_FILE, json.dumps({"format": SIZES_FORMAT, "sizes": sizes}, indent=1))
    return root / SIZES_FILE


def ended_by_oom(root: str | Path, err: WorkerFailed) -> OutOfMemoryOnRank:
    """Save the halved value `err` (a WorkerFailed caused by RankOutOfMemory) carries; the error
    that ends the run, naming the rank, its node, the phase, the file and the checkpoint."""
    oom: RankOutOfMemory = err.cause
    path = save_halved(root, oom.key, oom.value)
    newest = newest_resumable(root)
    resume = (f"the last checkpoint {newest} is intact" if newest is not None
              else "no checkpoint yet: the re-run starts over")
    where = f" on node {err.node}" if err.node else ""
    return OutOfMemoryOnRank(
        f"rank {err.rank}{where} ran out of memory in {err.phase} with {oom.key}={oom.old}, ending the run rather "
        f"than hang the other ranks in FSDP2's collectives; {oom.key}={oom.value} is saved in {path} and {resume}: "
        f"run the same command to resume with it")


def _largest_divisor(n: int, at_most: int) -> int:
    return max(d for d in range(1, min(n, at_most) + 1) if n % d == 0)


def apply_saved(plan: StepPlan, root: str | Path) -> StepPlan:
    """`plan` with its micro-batch values capped at those saved under `root`, a warning for each."""
    saved = read_saved(root)
    current = {p.micro.key: p.micro.value for p in plan.phases if p.micro is not None}
    changed = {}
    for key, value in saved.items():
        if key not in current or value >= current[key]:
            continue  # a key of another stage's plan, or a config already as small
        for u in (plan.actor, plan.critic):
            # A training micro-batch must divide the rank's mini-batch (config/plan.py); halving an
            # odd value may not: take the largest divisor below it.
            if u is not None and u.micro.key == key and not u.micro.by_tokens:
                value = _largest_divisor(u.per_rank_mini, value)
        changed[key] = value
        log.warning(f"{key}={value}, not {current[key]}: an out-of-memory error ended an earlier run of "
                    f"{Path(root)} and saved it in {Path(root) / SIZES_FILE} (delete the file to use the config's)")
    return plan.with_micro(changed) if changed else plan
