"""Checkpoint directories on the controller: atomic commit, the resume point, pruning, trainer state.

The layout and what counts as complete: logicrl/checkpoint_layout.py. A save goes into
`global_step_N.tmp-<uuid>/`; `commit` writes the manifest and COMPLETE, renames it into place and only
then moves the `latest` pointer, so a crash (even SIGKILL) leaves the previous state or the new one. A
file system that refuses the save (full, read-only) ends it with `SaveFailed`, one line naming the
cause, the directory and the checkpoint still intact. MANIFEST.json holds every file's size and CRC-32,
taken from what the writers summed as they wrote (logicrl/checksums.py; only the controller's own
small JSON files are summed by reading them); at resume the chosen checkpoint is read in full against
it before any rank loads it, and a damaged one is set aside. One without a manifest (older, or copied
without it) cannot be verified so: it is said to be unverified, its files are checked against its DCP
index, and the trainer checks its weights for NaN/inf once loaded. Nothing here unpickles: the trainer
state is JSON, RNG states included. What users see: docs/faults.md.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import shutil
import time
import uuid
import zlib
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

from logicrl.checkpoint_layout import (  # noqa: F401 - re-exported: the trainer's callers use these names from here
    COMPLETE_MARKER,
    LATEST_FILE,
    MANIFEST_FILE,
    STATE_FILE,
    TMP_DIR,
    complete_checkpoints,
    is_complete,
    newest_resumable,
    read_latest_pointer,
    resumable,
    step_dir,
)
from logicrl.checksums import file_checksum, is_sidecar, recorded
from logicrl.config.errors import ConfigError
from logicrl.workers.checkpoint import index_damage

log = logging.getLogger("logicrl.trainer")
MANIFEST_FORMAT = 2  # 1: [size, CRC-32 as an int, or None above 1 MiB]; 2: [size, "crc32:<hex>"] for every file
STATE_FORMAT = 1  # bump when trainer_state.json changes shape; read_trainer_state refuses newer ones


# ---------------------------------------------------------------- trainer state
@dataclass
class TrainerState:
    """What the controller needs to continue exactly where it stopped (the ranks save the rest)."""

    step: int  # global steps completed; the next step to run is `step`
    # Generation rounds drawn: `step`, or more with dynamic sampling (trainer/dynamic_sampling.py).
    sampler_position: int
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
def begin(root: str | Path, step: int) -> Path:
    """A fresh, empty `global_step_N.tmp-<uuid>/` under `root` for ranks and controller to write into."""
    Path(root).mkdir(parents=True, exist_ok=True)
    tmp = Path(root) / f"global_step_{step}.tmp-{uuid.uuid4().hex}"
    tmp.mkdir()
    return tmp


def commit(tmp: str | Path) -> Path:
    """Mark `tmp` complete, rename it to `global_step_N`, then move the `latest` pointer. Returns the final path."""
    tmp = Path(tmp)
    match = TMP_DIR.fullmatch(tmp.name)
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
    if TMP_DIR.fullmatch(tmp.name):
        shutil.rmtree(tmp, ignore_errors=True)


class SaveFailed(Exception):
    """The file system refused a save (full, read-only, no permission): one line for the user."""

    def __init__(self, message: str):
        super().__init__(" ".join(message.split()))


_FIXES = {errno.ENOSPC: "free disk there or point trainer.default_local_dir elsewhere",
          errno.EDQUOT: "free some of your quota there or point trainer.default_local_dir elsewhere",
          errno.EROFS: "make it writable again or point trainer.default_local_dir elsewhere",
          errno.EACCES: "make it writable again or point trainer.default_local_dir elsewhere",
          errno.EPERM: "make it writable again or point trainer.default_local_dir elsewhere"}


# What a file system says when it refuses a write; the first five have a fix of their own above.
_FILE_SYSTEM_ERRORS = {*_FIXES, errno.EIO, errno.ENOENT, errno.ESTALE, errno.EFBIG}


def save_failed(err: BaseException, root: str | Path, step: int) -> SaveFailed | None:
    """`err` as a SaveFailed when a file system error is behind it (raised here, or by a rank: the
    worker group's error carries the rank's exception as `cause`), else None."""
    cause = err if isinstance(err, OSError) else getattr(err, "cause", None)
    if not isinstance(cause, OSError) or cause.errno not in _FILE_SYSTEM_ERRORS:
        return None  # a lost connection between ranks is an OSError too, and not the disk's doing
    root = Path(root)
    what = cause.strerror or os.strerror(cause.errno)
    where = ""
    if cause.filename:
        name = Path(cause.filename)
        # The file inside the save's tmp dir says which writer met it (actor/__0_0.distcp, huggingface/...).
        tmp = next((p for p in name.parents if TMP_DIR.fullmatch(p.name)), None)
        base = tmp if tmp is not None else root if root in name.parents else None
        where = f" ({name.relative_to(base) if base is not None else name})"
    fix = _FIXES.get(cause.errno, "check that file system or point trainer.default_local_dir elsewhere")
    newest = newest_resumable(root)
    kept = (f"{newest.name} is intact and the same command resumes from it" if newest is not None
            else "no checkpoint was saved before it, so the same command starts over")
    return SaveFailed(f"saving global_step_{step} in {root} failed: {what}{where}: {fix}; {kept}")


@contextmanager
def saving(root: str | Path, step: int) -> Iterator[Path]:
    """`with saving(root, step) as tmp:` write into tmp; committed on success, dropped on an exception.
    A file system error (here or on a rank) comes out as SaveFailed; what could not be removed of the
    tmp dir (a read-only directory) is swept at the next start (remove_stale_tmp)."""
    try:
        tmp = begin(root, step)
    except OSError as err:
        if (failed := save_failed(err, root, step)) is None:
            raise
        raise failed from err
    try:
        yield tmp
        commit(tmp)
    except BaseException as err:
        abort(tmp)
        if (failed := save_failed(err, root, step)) is not None:
            raise failed from err
        raise


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
    """{relative path: [size, checksum]} of every file under `directory`. A checksum comes from the
    writer's record when its size still matches (no second read: logicrl/checksums.py), else from
    reading the file; the records are folded in and removed."""
    sums = recorded(directory, remove=True)
    files = {}
    for path in sorted(p for p in directory.rglob("*") if p.is_file()):
        rel = path.relative_to(directory).as_posix()
        if rel in (MANIFEST_FILE, COMPLETE_MARKER) or is_sidecar(path):
            continue
        size = path.stat().st_size
        known = sums.get(rel)
        files[rel] = [size, known[1] if known is not None and known[0] == size else file_checksum(path)]
    return {"format": MANIFEST_FORMAT, "files": files}


def has_manifest(directory: str | Path) -> bool:
    return (Path(directory) / MANIFEST_FILE).is_file()


def damage(directory: str | Path) -> str | None:
    """What is wrong with a complete checkpoint by its manifest, or None (also without a manifest:
    `verified` says what it checks then).
    Sizes first (a file cut short is named without reading the rest), then every file's checksum:
    the whole checkpoint is read once."""
    directory = Path(directory)
    try:
        data = json.loads((directory / MANIFEST_FILE).read_text())
        files = data["files"]
        entries = [(rel, int(size), checksum) for rel, (size, checksum) in files.items()]
    except FileNotFoundError:
        return None  # saved before manifests existed
    except (json.JSONDecodeError, KeyError, TypeError, ValueError, AttributeError):
        return f"its {MANIFEST_FILE} is unreadable"
    for rel, size, _ in entries:
        path = directory / rel
        if not path.is_file():
            return f"{rel} is missing"
        actual = path.stat().st_size
        if actual != size:
            return f"{rel} is {actual} bytes, {size} when saved"
    for rel, _, checksum in entries:
        if checksum is None:
            continue  # format 1 summed only files up to 1 MiB
        if isinstance(checksum, int):  # format 1: a bare CRC-32
            same = zlib.crc32((directory / rel).read_bytes()) == checksum
        else:
            same = file_checksum(directory / rel) == checksum
        if not same:
            return f"{rel} changed since it was saved (CRC-32)"
    return None


def set_aside(path: Path, problem: str) -> Path:
    """Rename a damaged checkpoint out of the global_step_N namespace (kept for the user), and
    point `latest` at the newest intact one left."""
    aside = path.with_name(f"{path.name}.corrupt-{time.strftime('%Y%m%d-%H%M%S')}")
    os.rename(path, aside)
    _fsync_dir(path.parent)
    log.warning(f"checkpoint {path} is damaged ({problem}): set aside as {aside.name}; the newest intact one "
                "before it is used")
    return aside


# ---------------------------------------------------------------- what is on disk
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
        if TMP_DIR.fullmatch(entry.name) and entry.is_dir() and not entry.is_symlink():
            shutil.rmtree(entry, ignore_errors=True)
            removed.append(entry)
    return removed


def find_resume_point(root: str | Path, resume_mode: str, clean: bool = True) -> Path | None:
    """trainer.resume_mode -> the checkpoint to resume from, or None to start fresh.

    "auto": the newest complete checkpoint under `root` (None if there is none); "disable": None;
    anything else is a path to one checkpoint, which must be complete. With `clean`, leftover tmp
    dirs under `root` are removed first (they are ignored either way).
    """
    if clean:
        remove_stale_tmp(root)  # a failed save's debris, also when starting over
    if resume_mode == "disable":
        return None
    if resume_mode == "auto":
        latest = read_latest_pointer(root)
        if above := [path.name for step, path in complete_checkpoints(root) if latest is not None and step > latest]:
            log.warning(f"{', '.join(above)} under {root}: newer than the step {LATEST_FILE} names ({latest}), so "
                        "not the last thing saved here (an earlier run's, or a save cut off before the pointer "
                        f"moved): left as it is, not resumed (trainer.resume_mode=<path> resumes one by name)")
        for step, path in resumable(root):
            problem = verified(path)
            if problem is None:
                if latest != step:
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
    if problem := verified(path):
        raise ConfigError(f"trainer.resume_mode={resume_mode} is damaged ({problem}): pick an older global_step_N "
                          "or use auto, which skips damaged ones")
    return path


def verified(path: Path) -> str | None:
    """What is wrong with `path` (None: nothing found), saying how it was checked and how long it took.

    With a manifest: every file's size and CRC-32 (the whole checkpoint read once). Without one nothing
    vouches for the bytes: the files must hold every item their DCP index names, and the line says the
    checkpoint is unverified (the trainer checks its weights for NaN/inf once the ranks loaded them)."""
    start = time.perf_counter()
    if not has_manifest(path):
        problem = index_damage(path)
        if problem is None:
            log.warning(f"{path} has no {MANIFEST_FILE} (saved before manifests, or copied without it), so its content "
                        "is unverified: its files hold every item their DCP index names, and its weights and "
                        "optimizer state are checked for NaN/inf once loaded; a change that keeps them finite "
                        "goes unseen")
        return problem
    problem = damage(path)
    if problem is None:
        size = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
        log.info(f"verified {path} ({size / 1e9:.2f} GB) against its {MANIFEST_FILE} in "
                 f"{time.perf_counter() - start:.1f} s")
    return problem


def prune(root: str | Path, keep: int | None) -> list[Path]:
    """Delete all but the newest `keep` complete checkpoints (None or -1: keep all); returns what it removed.

    The newest complete checkpoint always stays, even with keep=0. Incomplete `global_step_N` dirs,
    tmp dirs, checkpoints above the step `latest` names (an earlier run's) and any other file are left
    alone: only what this module can prove is an old, complete checkpoint of this run goes. Each one is
    first renamed to a tmp name (atomic), so a crash mid-delete leaves debris that is ignored, never a
    half-deleted dir that still looks complete.
    """
    if keep is None or keep < 0:
        return []
    found = resumable(root)[::-1]  # oldest first
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
