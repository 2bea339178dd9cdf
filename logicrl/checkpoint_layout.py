"""The names of a checkpoint root on disk, and which checkpoints in it are complete.

    global_step_N/                      trainer_state.json, shape.json, config.json, actor/ critic/,
                                        huggingface/, MANIFEST.json, COMPLETE (written last)
    global_step_N.tmp-<uuid>/           a save in flight, or the debris of one that failed
    global_step_N.corrupt-<time>/       found damaged at resume, set aside (never deleted)
    latest_checkpointed_iteration.txt   "N", replaced atomically after the rename

The trainer writes these (trainer/checkpoint.py) and the preflight reads them before Ray starts
(preflight/checkpoints.py), so the names, the one rule of what is complete (a COMPLETE file in a
global_step_N directory) and the one rule of which checkpoint resumes (the newest at or below the step
`latest` names: above it is an earlier run's, or a save cut off before the pointer moved) live here,
below both. Nothing here writes.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

LATEST_FILE = "latest_checkpointed_iteration.txt"  # verl's name, so its tooling finds our runs
COMPLETE_MARKER = "COMPLETE"
MANIFEST_FILE = "MANIFEST.json"
STATE_FILE = "trainer_state.json"
SHAPE_FILE = "shape.json"  # what the checkpoint fits: model, LoRA, roles (preflight/checkpoints.py)
CONFIG_FILE = "config.json"  # the run's resolved config, {dotted key: value}: what a later launch is compared with

STEP_DIR = re.compile(r"global_step_(\d+)")
# Only names checkpoint.begin creates: pruning and the stale-tmp sweep delete nothing else.
TMP_DIR = re.compile(r"global_step_(\d+)\.tmp-[0-9a-f]{32}")


def step_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"global_step_{step}"


def step_of(path: str | Path) -> int | None:
    """N of a `global_step_N` or `global_step_N.tmp-<uuid>` directory, else None."""
    name = Path(path).name
    match = STEP_DIR.fullmatch(name) or TMP_DIR.fullmatch(name)
    return int(match.group(1)) if match else None


def is_complete(path: str | Path) -> bool:
    path = Path(path)
    return STEP_DIR.fullmatch(path.name) is not None and (path / COMPLETE_MARKER).is_file()


def complete_checkpoints(root: str | Path) -> list[tuple[int, Path]]:
    """(step, path) of every complete checkpoint under `root`, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for entry in root.iterdir():
        match = STEP_DIR.fullmatch(entry.name)
        if match and entry.is_dir() and is_complete(entry):
            found.append((int(match.group(1)), entry))
    return sorted(found)


def holds_checkpoints(root: str | Path) -> bool:
    """Whether `root` or, for a curriculum, one of its stage directories holds a complete checkpoint."""
    root = Path(root)
    if complete_checkpoints(root):
        return True
    return root.is_dir() and any(entry.is_dir() and complete_checkpoints(entry) for entry in root.iterdir())


def read_latest_pointer(root: str | Path) -> int | None:
    """The step in `latest_checkpointed_iteration.txt`, or None when there is none."""
    try:
        return int((Path(root) / LATEST_FILE).read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def resumable(root: str | Path) -> list[tuple[int, Path]]:
    """(step, path) of the complete checkpoints `trainer.resume_mode=auto` may take, newest first: those
    at or below the step `latest_checkpointed_iteration.txt` names (all of them without one). One above
    it was not the last thing saved here: an earlier run's (a run resumed from an older checkpoint saves
    its own steps below it), or a save cut off between its rename and the pointer's move."""
    found = complete_checkpoints(root)
    latest = read_latest_pointer(root)
    return [(step, path) for step, path in reversed(found) if latest is None or step <= latest]


def newest_resumable(root: str | Path) -> Path | None:
    """The checkpoint resume_mode=auto tries first, or None."""
    found = resumable(root)
    return found[0][1] if found else None


def aside_name(root: str | Path) -> Path:
    """A free name beside `root` to move a finished or unwanted run's directory to."""
    root = Path(root)
    candidate, n = root.with_name(f"{root.name}.old"), 1
    while candidate.exists():
        n += 1
        candidate = root.with_name(f"{root.name}.old{n}")
    return candidate


def start_over_hint(root: str | Path, key: str = "trainer.default_local_dir=<another directory>") -> str:
    """How to start a new run where `root` holds one: never in place, so nothing of the old run mixes in.
    `key`: the setting that gives a run another directory (config-aware callers know which it is)."""
    return (f"to start a new run, give it a directory of its own ({key}) or move this one aside first: "
            f"mv {shlex.quote(str(root))} {shlex.quote(str(aside_name(root)))}")
