"""`python main_ppo.py ...` without paying Python's start and the driver's third-party imports each time.

A launch of the tiny run spends about 6 of its driver's 8-12 CPU s importing torch, transformers (the
tokenizer's module pulls in the modeling code and torch._dynamo), Ray, Hydra and pyarrow; make test makes
about a hundred. A server started once per test process imports them, and every launch is a fork of it
that then runs main_ppo.py as `__main__` as the interpreter would: its own session, working directory,
environment, argv, stdout and stderr, and logicrl imported fresh (the server imports none of it, so no
module state crosses launches). The server is single-threaded when it forks; it reaps its children and
reports each exit status. What a forked launch cannot show is the interpreter's own start (a syntax error
in main_ppo.py still fails here: it is compiled in the child), and modules imported with the server's
environment: `run_main` starts a new server when the test's environment differs from the server's in
anything but PER_RUN (LOGICRL_INJECT_FAULT, read by logicrl at run time; pytest's PYTEST_CURRENT_TEST), and a
real process for a run whose own variables differ from the test's. A run the test signals is a `Forked`
handle with what the tests use of subprocess.Popen.
"""

from __future__ import annotations

import atexit
import json
import os
import runpy
import select
import signal
import subprocess
import sys
import tempfile
import time
import traceback
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
# The driver's heavy imports that read nothing of a run's own (its argv, files, LOGICRL_* variables).
PRELOAD = ("torch", "transformers", "transformers.models.auto.tokenization_auto", "tokenizers", "hydra",
           "hydra.main", "omegaconf", "pyarrow.parquet", "pandas", "tensordict", "safetensors.torch", "psutil",
           "numpy")
# Variables a launch may set differently from the server: read after the fork, by logicrl alone, or by nothing
# the server imports (pytest sets PYTEST_CURRENT_TEST for every test: compared, it started a server per test).
PER_RUN = ("LOGICRL_INJECT_FAULT", "PYTEST_CURRENT_TEST")


# ---------------------------------------------------------------- the server (its own process)
def _child(request: dict) -> None:
    """In the forked child: become `python main_ppo.py *argv` in its own session, then exit with its code."""
    os.setsid()
    # As a new interpreter whose SIGINT was not ignored: a KeyboardInterrupt (a pytest-xdist worker, and so
    # the server, may have it ignored).
    signal.signal(signal.SIGINT, signal.default_int_handler)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    null = os.open(os.devnull, os.O_RDONLY)
    os.dup2(null, 0)
    for fd, path in ((1, request["out"]), (2, request["err"])):
        os.dup2(os.open(path, os.O_WRONLY | os.O_TRUNC), fd)
    script = str(ROOT / "main_ppo.py")
    sys.argv = [script, *request["argv"]]
    sys.path[0] = str(ROOT)
    code = 0
    try:
        runpy.run_path(script, run_name="__main__")
    except SystemExit as exc:  # what the interpreter makes of sys.exit(...)
        if isinstance(exc.code, int) or exc.code is None:
            code = exc.code or 0
        else:
            print(exc.code, file=sys.stderr)
            code = 1
    except KeyboardInterrupt:
        traceback.print_exc()
        code = 128 + signal.SIGINT
    except BaseException:  # noqa: BLE001 - an uncaught error: its traceback and exit 1, as the interpreter
        traceback.print_exc()
        code = 1
    try:
        atexit._run_exitfuncs()  # noqa: SLF001 - a forked child would skip them; the interpreter runs them
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except Exception:  # noqa: BLE001, S110 - a closed pipe: nothing left to say
                pass
        os._exit(code)


def serve(requests: int, replies: int) -> None:
    """Read one JSON request a line from fd `requests`; reply `started <pid>` and, later, `exit <pid> <code>`."""
    for name in PRELOAD:
        __import__(name)
    reply = os.fdopen(replies, "w", buffering=1)
    reply.write("ready\n")
    pending = b""
    while True:
        ready, _, _ = select.select([requests], [], [], 0.05)
        if ready:
            chunk = os.read(requests, 1 << 16)
            if not chunk:
                return  # the test process ended
            pending += chunk
            while b"\n" in pending:
                line, pending = pending.split(b"\n", 1)
                sys.stdout.flush(), sys.stderr.flush()
                pid = os.fork()
                if pid == 0:
                    os.close(requests), reply.close()
                    _child(json.loads(line))
                reply.write(f"started {pid}\n")
        while True:
            try:
                pid, status = os.waitpid(-1, os.WNOHANG)
            except ChildProcessError:
                break
            if pid == 0:
                break
            reply.write(f"exit {pid} {os.waitstatus_to_exitcode(status)}\n")


# ---------------------------------------------------------------- the client (the test process)
class Server:
    def __init__(self, env: dict[str, str]):
        self.env = dict(env)
        req_read, self.requests = os.pipe()
        self.replies, rep_write = os.pipe()
        self.proc = subprocess.Popen([sys.executable, "-c", f"from tests.helpers.launcher import serve; "
                                      f"serve({req_read}, {rep_write})"], cwd=ROOT, env=self.env,
                                     pass_fds=(req_read, rep_write), start_new_session=True,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        os.close(req_read), os.close(rep_write)
        self.buffer, self.launches = b"", 0
        self.exits: dict[int, int] = {}  # pid -> exit code, as the server reported them
        assert self._line(timeout=300) == "ready", "the launch server did not start"

    def _line(self, timeout: float) -> str | None:
        deadline = time.monotonic() + timeout
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.replies], [], [], left)[0]:
                return None
            chunk = os.read(self.replies, 1 << 16)
            if not chunk:
                raise RuntimeError("the launch server died")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line.decode()

    def exit_code(self, pid: int, timeout: float) -> int | None:
        """`pid`'s exit code once the server reports it within `timeout` s (0: only what is already in)."""
        deadline = time.monotonic() + timeout
        while pid not in self.exits:
            line = self._line(timeout=max(0.0, deadline - time.monotonic()))
            if line is None:
                return None
            if line.startswith("exit "):
                _, done, status = line.split()
                self.exits[int(done)] = int(status)
        return self.exits[pid]

    def stop(self) -> None:
        if self.proc.returncode is not None:
            return
        os.close(self.requests)  # the server reads the end of its input and returns
        self.proc.wait(timeout=30)
        os.close(self.replies)

    def alive(self) -> bool:
        return self.proc.poll() is None

    def serves(self, env: dict[str, str]) -> bool:
        strip = lambda e: {k: v for k, v in e.items() if k not in PER_RUN}  # noqa: E731
        return strip(env) == strip(self.env)

    def start(self, argv: list[str], cwd: Path, env: dict[str, str]) -> Forked:
        self.launches += 1
        out, err = (Path(tempfile.gettempdir()) / f"logicrl-launch-{os.getpid()}-{self.launches}.{n}" for n in "oe")
        out.write_bytes(b""), err.write_bytes(b"")
        request = {"argv": argv, "cwd": str(cwd), "env": env, "out": str(out), "err": str(err)}
        os.write(self.requests, (json.dumps(request) + "\n").encode())
        started = self._line(timeout=60)
        assert started and started.startswith("started "), started
        return Forked(self, int(started.split()[1]), [sys.executable, str(ROOT / "main_ppo.py"), *argv], out, err)


class Forked:
    """A forked run with what tests use of subprocess.Popen (pid, poll, wait, communicate, send_signal, kill,
    returncode; text stdout and stderr from communicate). It leads its own session, as with
    start_new_session; the server, its parent, reaps it, so its pid is signalled only while it runs."""

    def __init__(self, server: Server, pid: int, args: list[str], out: Path, err: Path):
        self.server, self.pid, self.args, self._out, self._err = server, pid, args, out, err
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.returncode = self.server.exit_code(self.pid, timeout=0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        if self.returncode is None:
            self.returncode = self.server.exit_code(self.pid, timeout=1e9 if timeout is None else timeout)
            if self.returncode is None:
                raise subprocess.TimeoutExpired(self.args, timeout)
        return self.returncode

    def communicate(self, timeout: float | None = None) -> tuple[str, str]:
        self.wait(timeout)
        texts = [path.read_text(errors="replace") if path.exists() else "" for path in (self._out, self._err)]
        for path in (self._out, self._err):
            path.unlink(missing_ok=True)
        return texts[0], texts[1]

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self) -> None:
        self.send_signal(signal.SIGTERM)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)

    def result(self, timeout: float) -> subprocess.CompletedProcess:
        try:
            out, err = self.communicate(timeout)
        except subprocess.TimeoutExpired:
            _kill_session(self.pid)
            raise subprocess.TimeoutExpired(self.args, timeout, self._out.read_text(), self._err.read_text()) from None
        return subprocess.CompletedProcess(self.args, self.returncode, out, err)


def _kill_session(pid: int) -> None:
    try:
        os.killpg(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


_server: Server | None = None


def launch(argv: list[str], cwd: Path, env: dict[str, str], base: dict[str, str],
           timeout: float | None) -> subprocess.CompletedProcess | Forked | None:
    """main_ppo.py's run forked from this process's server, started with the environment `base`: its
    result, or with timeout=None the running Forked; None where a real process must run it (`env`
    differs from `base` in more than PER_RUN)."""
    global _server
    if _server is None or not _server.alive() or not _server.serves(base):
        if _server is not None and _server.alive():
            _server.stop()
        _server = Server({k: v for k, v in base.items() if k not in PER_RUN})
        atexit.register(_server.stop)  # waited for: its runs' CPU is counted in the test process's children
    if not _server.serves(env):
        return None
    run = _server.start(argv, cwd, env)
    return run if timeout is None else run.result(timeout)
