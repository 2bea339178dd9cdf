"""The names of a checkpoint root on disk, and which checkpoints in it are complete.

    global_step_N/                      trainer_state.json, shape.json, actor/ critic/, huggingface/,
                                        MANIFEST.json, COMPLETE (written last)
    global_step_N.tmp-<uuid>/           a save in flight, or the debris of one that failed
    global_step_N.corrupt-<time>/       found damaged at resume, set aside (never deleted)
    latest_checkpointed_iteration.txt   "N", replaced atomically after the rename

The trainer writes these (trainer/checkpoint.py) and the preflight reads them before Ray starts
(preflight/checkpoints.py), so the names and the one rule of what is complete (a COMPLETE file in a
global_step_N directory) live here, below both. Nothing here writes.
"""

from __future__ import annotations

import re
from pathlib import Path

LATEST_FILE = "latest_checkpointed_iteration.txt"  # verl's name, so its tooling finds our runs
COMPLETE_MARKER = "COMPLETE"
MANIFEST_FILE = "MANIFEST.json"
STATE_FILE = "trainer_state.json"
SHAPE_FILE = "shape.json"  # what the checkpoint fits: model, LoRA, roles (preflight/checkpoints.py)

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
