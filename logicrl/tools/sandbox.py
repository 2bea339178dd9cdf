"""Runs a piece of Python in a separate, confined process (the parent's side; sandbox_launch.py is the
child's). Per run: a fresh temporary work directory (deleted after), none of the trainer's environment, `python -I`,
rlimits on memory, CPU time, file size and open files, a wall-clock timeout that kills the whole
process group, stdout and stderr read with a bound and cut in the middle, and where the kernel allows
it: no network, a read-only filesystem but the work directory, a pid namespace, a pids cgroup.

Processes: not RLIMIT_NPROC, which does not bind root and otherwise counts all of the user's processes
and threads on the machine (a trainer's Ray workers would leave the code none). A pids cgroup where
one can be made, else a watchdog thread that counts the launcher's descendants and kills them all past
the limit (a fork loop may overshoot it between two polls; the pid namespace still ends them all).
docs/tools.md says what this does and does not protect against.
"""

from __future__ import annotations

import json
import os
import select
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path

LAUNCHER = Path(__file__).with_name("sandbox_launch.py")
# The code's whole environment: nothing of the trainer's (no tokens, no paths). Math libraries would
# otherwise start a thread per core on import, which on a large node breaks the memory and process
# limits (stacks and buffers count against RLIMIT_AS) and competes with the trainer for its cores.
CODE_ENV = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}
_CGROUP_V1 = Path("/sys/fs/cgroup/pids")
_CGROUP_V2 = Path("/sys/fs/cgroup")
_READ_CHUNK = 65536


@dataclass(frozen=True)
class SandboxLimits:
    timeout_s: float = 10.0
    memory_mb: int = 1024
    cpu_s: int | None = None  # None: the timeout, rounded up
    file_mb: int = 16
    open_files: int = 64
    processes: int = 64  # tasks at once: with a pids cgroup threads count too (a BLAS pool is one per core)
    output_chars: int = 4096  # stdout and stderr together, as the model sees them
    isolate_network: bool = True
    read_only_fs: bool = True
    use_cgroup: bool = True  # False: the watchdog only (tests use it to exercise the fallback)
    use_namespaces: bool = True  # False: no namespace at all (tests use it for machines that allow none)
    site_packages: bool = True  # the interpreter's installed packages importable (numpy, sympy ...)
    drop_capabilities: bool = True  # root's capabilities gone before the code runs (no effect for non-root)


@dataclass
class SandboxRun:
    stdout: str
    stderr: str
    returncode: int | None
    timed_out: bool = False
    limit_hit: str | None = None  # "processes", "output" ...: why the sandbox killed it early
    dropped: int = 0  # bytes of output not kept (the middle of a stream past twice output_chars)
    latency_s: float = 0.0
    isolation: dict = field(default_factory=dict)  # what the launcher managed to apply


class _Capped:
    """A pipe read to its end, keeping its first and last `keep` characters' worth of bytes."""

    def __init__(self, stream, keep: int):
        self.head, self.tail, self.total, self.keep = bytearray(), bytearray(), 0, keep
        self.thread = threading.Thread(target=self._read, args=(stream,), daemon=True)
        self.thread.start()

    def _read(self, stream) -> None:
        while chunk := stream.read1(_READ_CHUNK) if hasattr(stream, "read1") else stream.read(_READ_CHUNK):
            self.total += len(chunk)
            room = self.keep - len(self.head)
            if room > 0:
                self.head += chunk[:room]
                chunk = chunk[room:]
            self.tail = (self.tail + chunk)[-self.keep:]

    def text(self) -> tuple[str, int]:
        """The kept bytes decoded (head and tail joined where the middle was dropped), and how many
        bytes were dropped."""
        dropped = max(0, self.total - len(self.head) - len(self.tail))
        return (bytes(self.head) + bytes(self.tail)).decode("utf-8", "replace"), dropped


def run_python(code: str, limits: SandboxLimits = SandboxLimits()) -> SandboxRun:
    start = time.monotonic()
    workdir = os.path.realpath(tempfile.mkdtemp(prefix="logicrl-sandbox-"))
    cgroup = _make_cgroup(limits.processes) if limits.use_cgroup else None
    status_r, status_w = os.pipe()
    try:
        Path(workdir, "main.py").write_text(code)
        cfg = {"workdir": workdir, "python": sys.executable, "status_fd": status_w,
               "python_flags": ["-I"] if limits.site_packages else ["-I", "-S"],
               "cgroup": str(cgroup) if cgroup else None, "isolate_network": limits.isolate_network,
               "read_only_fs": limits.read_only_fs, "rlimits": _rlimits(limits),
               "drop_capabilities": limits.drop_capabilities, "namespaces": limits.use_namespaces, "env": CODE_ENV}
        proc = subprocess.Popen([sys.executable, "-I", "-S", str(LAUNCHER), json.dumps(cfg)], cwd=workdir, env={},
                                stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                start_new_session=True, pass_fds=(status_w,))
        os.close(status_w)
        status_w = -1
        # Each stream keeps head and tail of output_chars bytes: a stream up to twice the budget is kept
        # whole, so the caller's one middle cut of stdout+stderr is exact; past that the middle is dropped
        # here, counted in `dropped`, and falls inside the caller's cut.
        keep = max(64, limits.output_chars)
        out, err = _Capped(proc.stdout, keep), _Capped(proc.stderr, keep)
        # The launcher reports what it applied just before the code starts; the watchdog's mode
        # depends on whether it really joined the cgroup.
        isolation = _read_status(status_r, timeout=limits.timeout_s)
        watchdog = _Watchdog(proc.pid, limits.processes, cgroup if isolation.get("cgroup") else None)
        timed_out = False
        try:
            proc.wait(timeout=max(0.0, start + limits.timeout_s - time.monotonic()))
        except subprocess.TimeoutExpired:
            timed_out = True
        # Always, not only on timeout: background processes the code left behind die with the call.
        _kill_all(proc.pid, cgroup)
        proc.wait()
        limit_hit = watchdog.stop()
        if cgroup is not None and _pids_max_events(cgroup) > 0:
            limit_hit = "processes"
        out.thread.join(timeout=2.0)
        err.thread.join(timeout=2.0)
        (stdout, dropped_out), (stderr, dropped_err) = out.text(), err.text()
        return SandboxRun(stdout=stdout, stderr=stderr, returncode=None if timed_out else proc.returncode,
                          timed_out=timed_out, limit_hit=limit_hit, dropped=dropped_out + dropped_err,
                          latency_s=time.monotonic() - start, isolation=isolation)
    finally:
        if status_w >= 0:
            os.close(status_w)
        os.close(status_r)
        if cgroup is not None:
            _remove_cgroup(cgroup)
        shutil.rmtree(workdir, ignore_errors=True)


def _rlimits(limits: SandboxLimits) -> dict[str, int]:
    mb = 1024 * 1024
    return {"RLIMIT_AS": limits.memory_mb * mb, "RLIMIT_CPU": int(limits.cpu_s or -(-limits.timeout_s // 1)),
            "RLIMIT_FSIZE": limits.file_mb * mb, "RLIMIT_NOFILE": limits.open_files, "RLIMIT_CORE": 0}


def _read_status(fd: int, timeout: float) -> dict:
    """The launcher's one status line; {} if it closed the pipe (died) or said nothing in time."""
    data, deadline = b"", time.monotonic() + timeout
    while not data.endswith(b"\n"):
        ready, _, _ = select.select([fd], [], [], max(0.0, deadline - time.monotonic()))
        chunk = os.read(fd, 4096) if ready else b""
        if not chunk:
            return {}
        data += chunk
    try:
        return json.loads(data.decode())
    except ValueError:
        return {}


def _kill_all(pid: int, cgroup: Path | None) -> None:
    if cgroup is None:
        # The launcher's tree first, while the launcher still re-parents orphans to itself: what left
        # the process group (setsid) is still below it. Where a pid namespace exists, ending the
        # launcher would be enough.
        for _ in range(50):
            tree = descendants(pid)
            if not tree:
                break
            for p in tree:
                try:
                    os.kill(p, signal.SIGKILL)
                except ProcessLookupError:
                    pass
    try:
        os.killpg(pid, signal.SIGKILL)  # the launcher's session: launcher, init, and all that stayed
    except ProcessLookupError:
        pass
    if cgroup is not None:  # whatever left the group (setsid) is still in the cgroup
        for _ in range(50):
            pids = _cgroup_pids(cgroup)
            if not pids:
                break
            for p in pids:
                try:
                    os.kill(p, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.01)


def _cgroup_root() -> Path | None:
    if (_CGROUP_V1 / "cgroup.procs").is_file():
        return _CGROUP_V1
    if "pids" in _read(_CGROUP_V2 / "cgroup.subtree_control").split():
        return _CGROUP_V2
    return None


_swept = False


def _sweep_stale_cgroups(root: Path) -> None:
    """Once per process: remove the empty cgroups of trainer processes that died mid-call (SIGKILL)."""
    global _swept
    if _swept:
        return
    _swept = True
    for path in root.glob("logicrl-sandbox-*-*"):
        try:
            os.kill(int(path.name.split("-")[2]), 0)
        except ProcessLookupError:
            try:
                path.rmdir()  # refused while a member lives: then it stays
            except OSError:
                pass
        except (ValueError, PermissionError):
            pass


def _make_cgroup(processes: int) -> Path | None:
    """A fresh pids cgroup capped at `processes` (+2: the launcher and init), or None where none can be made."""
    root = _cgroup_root()
    if root is None:
        return None
    _sweep_stale_cgroups(root)
    path = root / f"logicrl-sandbox-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    try:
        path.mkdir()
        (path / "pids.max").write_text(str(processes + 2))
        return path
    except OSError:
        try:
            path.rmdir()
        except OSError:
            pass
        return None


def _cgroup_pids(cgroup: Path) -> list[int]:
    return [int(p) for p in _read(cgroup / "cgroup.procs").split()]


def _pids_max_events(cgroup: Path) -> int:
    for line in _read(cgroup / "pids.events").splitlines():
        name, _, value = line.partition(" ")
        if name == "max":
            return int(value)
    return 0


def _remove_cgroup(cgroup: Path) -> None:
    for _ in range(100 if cgroup.is_dir() else 0):
        try:
            cgroup.rmdir()
            return
        except OSError:  # members still exiting
            for pid in _cgroup_pids(cgroup):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
            time.sleep(0.01)


def _read(path: Path) -> str:
    try:
        return path.read_text()
    except OSError:
        return ""


class _Watchdog:
    """Ends the run once it passes the process limit. With a pids cgroup the kernel already refused
    the extra fork; this notices the refusal (pids.events) and ends a program that would keep
    retrying until its timeout. Without one it counts the launcher's descendants itself.
    Descendants, not the process group: a child that calls setsid() leaves the group but not the
    tree (orphans are re-parented to the namespace's init, still ours)."""

    def __init__(self, root_pid: int, processes: int, cgroup: Path | None, interval: float = 0.05):
        self.root, self.limit, self.cgroup, self.interval = root_pid, processes + 2, cgroup, interval
        self.hit: str | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(self.interval):
            if self.cgroup is not None:
                if _pids_max_events(self.cgroup) > 0:
                    self.hit = "processes"
                    _kill_all(self.root, self.cgroup)
                continue
            tree = descendants(self.root)
            if len(tree) + 1 > self.limit:
                self.hit = "processes"
                for pid in [self.root, *tree]:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass

    def stop(self) -> str | None:
        self._stop.set()
        self._thread.join()
        return self.hit


def descendants(root: int) -> list[int]:
    """Every live process below `root`, from /proc's parent links."""
    children: dict[int, list[int]] = {}
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            stat = Path(entry.path, "stat").read_bytes()
        except OSError:
            continue
        # "pid (comm) state ppid ...": comm may hold spaces and parentheses; split after the last ')'.
        fields = stat[stat.rfind(b")") + 2:].split()
        if fields and fields[0] != b"Z":
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    out, frontier = [], [root]
    while frontier:
        nxt = [c for p in frontier for c in children.get(p, ())]
        out += nxt
        frontier = nxt
    return out
