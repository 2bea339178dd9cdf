"""One run per checkpoint directory: a lock on `<trainer.default_local_dir>/.logicrl.lock`.

Two runs writing one directory interleave their checkpoints (each resumes the other's steps and
saves over them), so a launch whose directory is held by a live run is refused in one line naming
that run. The lock is flock(2) on an open file: the kernel releases it when its holder dies, however
it dies (SIGKILL, the OOM killer), so a crashed run never leaves it stuck; the file's text only
says who holds it. On NFS, Linux emulates flock with fcntl locks, which the server arbitrates between
hosts. The descriptor is not inherited (Python opens files close-on-exec), so Ray's processes
never hold it after the driver is gone.
"""

from __future__ import annotations

import fcntl
import os
import socket
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from logicrl.errors import BadInput

LOCK_FILE = ".logicrl.lock"


def holder_text() -> str:
    started = time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime())
    return f"pid {os.getpid()} on {socket.gethostname()}, started {started}"


@contextmanager
def one_run_per_directory(directory: str | Path, key: str = "trainer.default_local_dir") -> Iterator[None]:
    """Hold `directory`'s lock while inside; BadInput at once if a live run holds it."""
    path = Path(directory) / LOCK_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            other = os.pread(fd, 512, 0).decode(errors="replace").strip() or "a run that has not written its name yet"
            raise BadInput(f"{key}={directory} is in use by another run ({other}): two runs in one directory would "
                           f"mix their checkpoints; wait for it to end or stop it, or give this run another {key}") \
                from None
        os.ftruncate(fd, 0)
        os.pwrite(fd, (holder_text() + "\n").encode(), 0)
        yield
    finally:
        os.close(fd)  # releases the lock; the file stays, its text names the last holder
