"""Checkpoint directories on the controller: atomic commit, the resume point, pruning, trainer state.

    global_step_N/                      trainer_state.json, actor/ critic/ (workers/checkpoint.py),
                                        huggingface/, MANIFEST.json, COMPLETE (written last)
    global_step_N.corrupt-<time>/       found damaged at resume, set aside (never deleted)
    latest_checkpointed_iteration.txt   "N", replaced atomically after the rename

A save goes into `global_step_N.tmp-<uuid>/`; `commit` writes COMPLETE, renames it into place and only
then moves the `latest` pointer, so a crash (even SIGKILL) leaves the previous state or the new one.
The COMPLETE markers decide what is resumable; the pointer is kept for verl's tools and for people.
At resume the newest is checked against its manifest (`damage`): every file's size, but checksums only
under SMALL_FILE bytes, since summing a 7B run's ~100 GB at each save and resume would cost more than
the failures sizes already catch (a copy cut short, a full disk). Nothing here unpickles: the trainer
state is JSON, RNG states included. What users see: docs/faults.md.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
import uuid
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from logicrl.config.errors import ConfigError

log = logging.getLogger("logicrl.trainer")
LATEST_FILE = "latest_checkpointed_iteration.txt"  # verl's name, so its tooling finds our runs
COMPLETE_MARKER = "COMPLETE"
MANIFEST_FILE = "MANIFEST.json"
SMALL_FILE = 1 << 20  # files up to this size also get a CRC-32 in the manifest
STATE_FILE = "trainer_state.json"
STATE_FORMAT = 1  # bump when trainer_state.json changes shape; read_trainer_state refuses newer ones

_STEP_DIR = re.compile(r"global_step_(\d+)")
# Only names `begin` creates: `prune` and `remove_stale_tmp` delete nothing else.
_TMP_DIR = re.compile(r"global_step_(\d+)\.tmp-[0-9a-f]{32}")


# ---------------------------------------------------------------- trainer state
@dataclass
class TrainerState:
    """What the controller needs to continue exactly where it stopped (the ranks save the rest)."""

    step: int  # global steps completed; the next step to run is `step`
    sampler_position: int  # EpochSampler's position; today equal to `step`, kept apart so it can diverge
    kl_coef: float | None = None  # the KL controller's `.value` (adaptive controllers move it)
    curriculum_stage: int | None = None
    rng: dict = field(default_factory=dict)  # logicrl.rng.capture_rng_state()
    extra: dict = field(default_factory=dict)  # JSON-safe, for state added later without a format bump


def write_trainer_state(directory: str | Path, state: TrainerState) -> None:
    write_durably(Path(directory) / STATE_FILE, json.dumps({"format": STATE_FORMAT, **asdict(state)}))


def read_trainer_state(directory: str | Path) -> TrainerState:
    data = json.loads((Path(directory) / STATE_FILE).read_text())
    fmt = data.pop("format", None)
    if fmt != STATE_FORMAT:
        raise ValueError(f"{Path(directory) / STATE_FILE} has format {fmt}, this logicrl reads {STATE_FORMAT}")
    return TrainerState(**data)


# ---------------------------------------------------------------- atomic commit
def step_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"global_step_{step}"


def begin(root: str | Path, step: int) -> Path:
    """A fresh, empty `global_step_N.tmp-<uuid>/` under `root` for ranks and controller to write into."""
    Path(root).mkdir(parents=True, exist_ok=True)
    tmp = Path(root) / f"global_step_{step}.tmp-{uuid.uuid4().hex}"
    tmp.mkdir()
    return tmp


def commit(tmp: str | Path) -> Path:
    """Mark `tmp` complete, rename it to `global_step_N`, then move the `latest` pointer. Returns the final path."""
    tmp = Path(tmp)
    match = _TMP_DIR.fullmatch(tmp.name)
    if match is None:
        raise ValueError(f"{tmp} is not a directory made by checkpoint.begin")
    step = int(match.group(1))
    _fsync_tree(tmp)  # the ranks' files must be on disk before the marker claims they are
    write_durably(tmp / MANIFEST_FILE, json.dumps(manifest(tmp)))
    write_durably(tmp / COMPLETE_MARKER, f"{step}\n")
    final = step_dir(tmp.parent, step)
    if final.exists():
        # Re-saving a step (e.g. the end-of-stage save landing on a save_freq step): move the old one
        # out of the complete set atomically first; for the instant between the two renames step N
        # is absent and resume falls back to the one before it, never to a half-written one.
        aside = tmp.parent / f"global_step_{step}.tmp-{uuid.uuid4().hex}"
        os.rename(final, aside)
        os.rename(tmp, final)
        shutil.rmtree(aside, ignore_errors=True)
    else:
        os.rename(tmp, final)
    _fsync_dir(tmp.parent)
    write_durably(tmp.parent / LATEST_FILE, f"{step}\n")
    return final


def abort(tmp: str | Path) -> None:
    """Drop an unfinished save (only ever a tmp dir)."""
    tmp = Path(tmp)
    if _TMP_DIR.fullmatch(tmp.name):
        shutil.rmtree(tmp, ignore_errors=True)


@contextmanager
def saving(root: str | Path, step: int) -> Iterator[Path]:
    """`with saving(root, step) as tmp:` write into tmp; committed on success, dropped on an exception."""
    tmp = begin(root, step)
    try:
        yield tmp
    except BaseException:
        abort(tmp)
        raise
    commit(tmp)


def write_durably(path: Path, text: str) -> None:
    """Write `path` via a sibling tmp file + fsync + os.replace: readers see the old or the new file."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    _fsync_dir(path.parent)


def _fsync_dir(directory: Path) -> None:
    # Makes a rename durable; some filesystems (and Windows) refuse fsync on a directory.
    try:
        fd = os.open(directory, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


def _fsync_tree(directory: Path) -> None:
    for dirpath, _, files in os.walk(directory):
        for name in files:
            try:
                with open(os.path.join(dirpath, name), "rb") as f:
                    os.fsync(f.fileno())
            except OSError:
                pass
        _fsync_dir(Path(dirpath))


# ---------------------------------------------------------------- integrity
def manifest(directory: Path) -> dict:
    """{relative path: [size, crc32 or None]} of every file under `directory`."""
    files = {}
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        rel = path.relative_to(directory).as_posix()
        if rel in (MANIFEST_FILE, COMPLETE_MARKER):
            continue
        size = path.stat().st_size
        files[rel] = [size, zlib.crc32(path.read_bytes()) if size <= SMALL_FILE else None]
    return {"format": 1, "files": files}


def damage(directory: str | Path) -> str | None:
    """What is wrong with a complete checkpoint by its manifest, or None (also without a manifest)."""
    directory = Path(directory)
    try:
        files = json.loads((directory / MANIFEST_FILE).read_text())["files"]
    except FileNotFoundError:
        return None  # saved before manifests existed
    except (json.JSONDecodeError, KeyError, TypeError):
        return f"its {MANIFEST_FILE} is unreadable"
    for rel, (size, crc) in files.items():
        path = directory / rel
        if not path.is_file():
            return f"{rel} is missing"
        actual = path.stat().st_size
        if actual != size:
            return f"{rel} is {actual} bytes, {size} when saved"
        if crc is not None and zlib.crc32(path.read_bytes()) != crc:
            return f"{rel} changed since it was saved (CRC-32)"
    return None


def set_aside(path: Path, problem: str) -> Path:
    """Rename a damaged checkpoint out of the global_step_N namespace (kept for the user), and
    point `latest` at the newest intact one left."""
    aside = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}")
    os.rename(path, aside)
    _fsync_dir(path.parent)
    log.warning(f"checkpoint {path} is damaged ({problem}): set aside as {aside.name}; the newest intact one before it is used")
    return aside


# ---------------------------------------------------------------- what is on disk
def is_complete(path: str | Path) -> bool:
    path = Path(path)
    return _STEP_DIR.fullmatch(path.name) is not None and (path / COMPLETE_MARKER).is_file()


def complete_checkpoints(root: str | Path) -> list[tuple[int, Path]]:
    """(step, path) of every complete checkpoint under `root`, oldest first."""
    root = Path(root)
    if not root.is_dir():
        return []
    found = []
    for entry in root.iterdir():
        match = _STEP_DIR.fullmatch(entry.name)
        if match and entry.is_dir() and is_complete(entry):
            found.append((int(match.group(1)), entry))
    return sorted(found)


def read_latest_pointer(root: str | Path) -> int | None:
    """The step in `latest_checkpointed_iteration.txt`, or None when there is none."""
    try:
        return int((Path(root) / LATEST_FILE).read_text().strip())
    except (FileNotFoundError, ValueError):
        return None


def remove_stale_tmp(root: str | Path) -> list[Path]:
    """Delete leftover `global_step_N.tmp-<uuid>` dirs of a crashed save; returns what it removed.

    Call it only when no save of this run is in flight (at start-up): a tmp dir being written looks
    the same as one abandoned. Complete checkpoints and other files are never touched.
    """
    root = Path(root)
    if not root.is_dir():
        return []
    removed = []
    for entry in root.iterdir():
        if _TMP_DIR.fullmatch(entry.name) and entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed


def find_resume_point(root: str | Path, resume_mode: str, clean: bool = True) -> Path | None:
    """trainer.resume_mode -> the checkpoint to resume from, or None to start fresh.

    "auto": the newest complete checkpoint under `root` (None if there is none); "disable": None;
    anything else is a path to one checkpoint, which must be complete. With `clean`, leftover tmp
    dirs under `root` are removed first (they are ignored either way).
    """
    if resume_mode == "disable":
        return None
    if clean:
        remove_stale_tmp(root)
    if resume_mode == "auto":
        found = complete_checkpoints(root)
        while found:
            step, path = found.pop()
            problem = damage(path)
            if problem is None:
                if read_latest_pointer(root) != step:
                    write_durably(Path(root) / LATEST_FILE, f"{step}\n")
                return path
            set_aside(path, problem)
        return None
    path = Path(resume_mode)
    if not path.is_dir():
        raise ConfigError(f"trainer.resume_mode={resume_mode} does not exist: pass a global_step_N directory, "
                          f"auto or disable")
    if not is_complete(path):
        raise ConfigError(f"trainer.resume_mode={resume_mode} is not a complete checkpoint (a global_step_N "
                          f"directory with a {COMPLETE_MARKER} file): pick an older global_step_N or use auto")
    if problem := damage(path):
        raise ConfigError(f"trainer.resume_mode={resume_mode} is damaged ({problem}): pick an older global_step_N "
                          "or use auto, which skips damaged ones")
    return path


def prune(root: str | Path, keep: int | None) -> list[Path]:
    """Delete all but the newest `keep` complete checkpoints (None or -1: keep all); returns what it removed.

    The newest complete checkpoint always stays, even with keep=0. Incomplete `global_step_N` dirs,
    tmp dirs and any other file are left alone: only what this module can prove is an old, complete
    checkpoint goes. Each one is first renamed to a tmp name (atomic), so a crash mid-delete
    leaves debris that is ignored, never a half-deleted dir that still looks complete.
    """
    if keep is None or keep < 0:
        return []
    found = complete_checkpoints(root)
    doomed = found[:max(0, len(found) - max(1, keep))]
    removed = []
    for step, path in doomed:
        trash = path.with_name(f"global_step_{step}.tmp-{uuid.uuid4().hex}")
        os.rename(path, trash)
        shutil.rmtree(trash, ignore_errors=True)
        removed.append(path)
    if removed:
        _fsync_dir(Path(root))
    return removed
