"""Content checksums of checkpoint files, computed from the bytes as they are written.

    with Checksums(directory, "rank0") as sums:   # one writer's files under `directory`
        with sums.open(path) as f:                 # a binary file that sums what passes through it
            f.write(data)
        sums.write_bytes(small_path, data)
    # on a clean exit: directory/.checksums-rank0.json, which the controller folds into MANIFEST.json
    recorded(directory)      # {path relative to directory: (size, "crc32:…")} of every writer below it
    file_checksum(path)      # the same by reading the file: what verification at resume does

CRC-32 (zlib's), as fast as a write into the page cache (docs/faults.md has the measurements): it is for
accidents (a torn copy, bit rot), not an adversary, and the algorithm is stored with each value. A stream
seeked away from its end records nothing; the manifest then sums that file by reading it.
"""

from __future__ import annotations

import json
import os
import threading
import zlib
from pathlib import Path

ALGORITHM = "crc32"
SIDECAR_PREFIX = ".checksums-"  # .checksums-<tag>.json: one per writer and directory, folded into the manifest
_READ_CHUNK = 4 << 20


def _value(crc: int) -> str:
    return f"{ALGORITHM}:{crc:08x}"


def file_checksum(path: str | Path) -> str:
    """The checksum of a file's content, read in chunks (never the whole file in memory)."""
    crc = 0
    with open(path, "rb") as f:
        while chunk := f.read(_READ_CHUNK):
            crc = zlib.crc32(chunk, crc)
    return _value(crc)


class SummedFile:
    """A binary file opened for writing that sums what is written through it. Only what DCP's and the
    exports' writers call is here: write, tell, flush, fileno, close (and seek, which gives up summing)."""

    def __init__(self, path: Path, take_fault=None):
        self.path, self.take_fault = path, take_fault
        self.raw = open(path, "wb")
        self.size, self.crc, self.summed = 0, 0, True

    def write(self, data) -> int:
        view = memoryview(data).cast("B")
        try:
            if self.take_fault is not None and (fault := self.take_fault()) is not None:
                raise fault
            written = self.raw.write(view)
        except OSError as err:
            # A failed write() names no file (ENOSPC mid-write): name it, for the one line the user sees.
            if err.filename is None:
                raise OSError(err.errno, err.strerror, str(self.path)) from err
            raise
        self.crc = zlib.crc32(view, self.crc)
        self.size += written
        return written

    def seek(self, offset: int, whence: int = os.SEEK_SET) -> int:
        position = self.raw.seek(offset, whence)
        if position != self.size:
            self.summed = False  # bytes may be overwritten out of order: the manifest will read the file
        return position

    def tell(self) -> int:
        return self.raw.tell()

    def flush(self) -> None:
        self.raw.flush()

    def fileno(self) -> int:
        return self.raw.fileno()

    def writable(self) -> bool:
        return True

    def close(self) -> None:
        self.raw.close()

    def __enter__(self) -> SummedFile:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class Checksums:
    """What one writer (a rank, in one directory) wrote, by path relative to `directory`.

    `fault` (tests: logicrl/faults.py's enospc/erofs) is raised by the first write of any file, as
    a full disk or a read-only remount would. Thread-safe: DCP may write files from several threads.
    """

    def __init__(self, directory: str | Path, tag: str, fault: OSError | None = None):
        self.directory, self.tag, self.fault = Path(directory), tag, fault
        self.files: dict[str, tuple[int, str]] = {}
        self.lock = threading.Lock()

    def _rel(self, path: str | Path) -> str:
        return Path(path).relative_to(self.directory).as_posix()

    def open(self, path: str | Path) -> _Recording:
        return _Recording(self, Path(path))

    def write_bytes(self, path: str | Path, data: bytes) -> None:
        with self.open(path) as f:
            f.write(data)

    def take_fault(self) -> OSError | None:
        """The injected failure, once: one full disk is met by the first write, not by every file."""
        with self.lock:
            fault, self.fault = self.fault, None
        return fault

    def add(self, path: Path, size: int, checksum: str) -> None:
        with self.lock:
            self.files[self._rel(path)] = (size, checksum)

    def moved(self, old: str | Path, new: str | Path) -> None:
        """A recorded file renamed (DCP's .metadata.tmp, the export's shard names fixed at the end)."""
        with self.lock:
            if (entry := self.files.pop(self._rel(old), None)) is not None:
                self.files[self._rel(new)] = entry

    def __enter__(self) -> Checksums:
        return self

    def write_record(self) -> None:
        """directory/.checksums-<tag>.json: call once every file is closed."""
        payload = {"algorithm": ALGORITHM, "files": {k: list(v) for k, v in sorted(self.files.items())}}
        (self.directory / f"{SIDECAR_PREFIX}{self.tag}.json").write_text(json.dumps(payload))

    def __exit__(self, kind, *_) -> None:
        if kind is None:  # a failed save is dropped whole: nothing to record
            self.write_record()


class _Recording:
    """`with sums.open(path) as f`: a SummedFile whose checksum is recorded when it closes cleanly."""

    def __init__(self, sums: Checksums, path: Path):
        self.sums, self.file = sums, SummedFile(path, sums.take_fault)

    def __enter__(self) -> SummedFile:
        return self.file

    def __exit__(self, kind, *_) -> None:
        self.file.close()
        if kind is None and self.file.summed:
            self.sums.add(self.file.path, self.file.size, _value(self.file.crc))


def recorded(directory: str | Path, remove: bool = False) -> dict[str, tuple[int, str]]:
    """Every writer's record under `directory`, by path relative to it; `remove` deletes the records
    once read (the manifest holds them from then on). A record that does not parse is skipped: its
    files are then summed by reading."""
    directory = Path(directory)
    out: dict[str, tuple[int, str]] = {}
    for sidecar in sorted(directory.rglob(f"{SIDECAR_PREFIX}*.json")):
        base = sidecar.parent.relative_to(directory)
        try:
            files = json.loads(sidecar.read_text())["files"]
            out.update({(base / rel).as_posix(): (int(size), str(value)) for rel, (size, value) in files.items()})
        except (json.JSONDecodeError, KeyError, TypeError, ValueError):
            pass
        if remove:
            sidecar.unlink()
    return out


def is_sidecar(path: str | Path) -> bool:
    name = Path(path).name
    return name.startswith(SIDECAR_PREFIX) and name.endswith(".json")
