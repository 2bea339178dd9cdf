"""What reaches the console and what goes only to the run directory's log file.

The console is for a person: the plan, one line per step under the progress bar, logicrl's own
warnings, the result. What vLLM and Ray say goes to Hydra's `<job>.log` in the run directory only.
trainer.verbose=true leaves every console stream as the engines set it up.

Three pieces:
- in the driver, before Ray is imported, `pin_ray_auth` chooses Ray's token-auth mode, so Ray
  stops warning at every start that it chose it; before Ray starts, `quiet_driver` leaves Ray's
  own `ray` logger its console handler for warnings only and gives it a handler on the file.
- in each worker, `quiet_worker`: vLLM writes through its own logging handlers, tqdm bars, `print`
  and C++ (oneDNN, NUMA, gloo), all on file descriptors 1 and 2, which Ray forwards to the
  driver's console. Only moving the descriptors catches all of them, so both are pointed at the
  log file; logicrl's loggers get a handler on a copy of the old stderr, which Ray still forwards.
- while the progress bar is up, `lines_above` puts every printed line above it.
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

FORMAT = "[%(asctime)s][%(name)s][%(levelname)s] - %(message)s"  # Hydra's, so the file reads as one log


def run_log_file(run_dir: Path) -> Path:
    """The run's log file: the one Hydra's job logging writes (the first file handler on the root
    logger), else `run_dir/logicrl.log` (a run started without Hydra, or with its logging off)."""
    for handler in logging.getLogger().handlers:
        if type(handler) is logging.FileHandler:  # not pytest's or other subclasses
            return Path(handler.baseFilename)
    return Path(run_dir) / "logicrl.log"


def pin_ray_auth(joining: bool) -> None:
    """In the driver, before `import ray`: choose Ray's token-auth mode explicitly.

    Ray 2.60 turns token auth on for a new local cluster and logs a warning saying so at every
    start unless RAY_AUTH_MODE is set ("Mode set explicitly; respect it without warning"). Pinning
    the mode Ray would choose keeps its behaviour and drops the notice. It must precede the import:
    Ray's C++ config reads the variable once, then (set later) a new cluster expects a token that
    ray.init never loads. Joining a cluster follows that cluster: a token given by path or value
    means token auth (Ray ≥ 2.59 heads turn it on, joining drivers do not), else it is left alone.
    """
    if not joining:
        os.environ.setdefault("RAY_AUTH_MODE", "token")
    elif os.environ.get("RAY_AUTH_TOKEN_PATH") or os.environ.get("RAY_AUTH_TOKEN"):
        os.environ.setdefault("RAY_AUTH_MODE", "token")


def quiet_driver(run_dir: Path, verbose: bool) -> str | None:
    """In the driver, before Ray starts: Ray's INFO lines to the run's log file, its warnings still
    on the console. Returns the log file that the workers should write to, None when verbose."""
    if verbose:
        return None
    log_file = run_log_file(run_dir)
    log_file.parent.mkdir(parents=True, exist_ok=True)
    ray_log = logging.getLogger("ray")  # does not propagate: Ray gives it its own stderr handler
    for handler in ray_log.handlers:
        if not isinstance(handler, logging.FileHandler):
            handler.setLevel(logging.WARNING)
    # One file handler, to this run's file: a curriculum calls this once per stage, a multirun once
    # per job (each with its own run directory).
    for handler in [h for h in ray_log.handlers if getattr(h, "logicrl_run_log", False)]:
        ray_log.removeHandler(handler)
        handler.close()
    to_file = logging.FileHandler(log_file)  # ray.init gives it Ray's own format
    to_file.logicrl_run_log = True
    ray_log.addHandler(to_file)
    logging.getLogger("matplotlib").setLevel(logging.WARNING)  # "generated new fontManager" once per machine
    return str(log_file)


def quiet_worker(log_file: str, rank: int) -> None:
    """In a worker process, before vLLM is imported: stdout and stderr to the log file; logicrl's
    loggers (INFO and up) to the console, through Ray, marked with the rank."""
    sys.stdout.flush()
    sys.stderr.flush()
    console = os.fdopen(os.dup(2), "w", buffering=1)  # Ray's worker-*.err: forwarded to the driver
    # On another node of a cluster without a shared filesystem the run directory does not exist yet:
    # that node's workers then write to the same path on their own disk.
    os.makedirs(os.path.dirname(log_file), exist_ok=True)
    fd = os.open(log_file, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)  # O_APPEND: ranks interleave lines
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    os.close(fd)
    logicrl_log = logging.getLogger("logicrl")
    for stream in (console, sys.stderr):  # sys.stderr now writes to the log file
        handler = logging.StreamHandler(stream)
        handler.setFormatter(logging.Formatter(FORMAT.replace("%(message)s", f"rank {rank}: %(message)s")))
        logicrl_log.addHandler(handler)
    logicrl_log.setLevel(logging.INFO)
    logicrl_log.propagate = False  # the root logger's last-resort handler would write it a third time


class _AboveBar:
    """A stand-in for sys.stdout or sys.stderr that writes each complete line above a tqdm bar."""

    def __init__(self, stream, bar):
        self.stream, self.bar, self.pending = stream, bar, ""

    def write(self, text: str) -> int:
        *lines, self.pending = (self.pending + text).split("\n")
        if lines:
            with self.bar.get_lock():  # Ray prints worker lines from its own thread
                self.bar.clear(nolock=True)
                self.stream.write("".join(line + "\n" for line in lines))
                self.stream.flush()
                self.bar.refresh(nolock=True)
        return len(text)

    def flush(self) -> None:
        self.stream.flush()

    def __getattr__(self, name):  # fileno, isatty, encoding: the real stream's
        return getattr(self.stream, name)


@contextmanager
def lines_above(bar) -> Iterator[None]:
    """While `bar` is on the console, every line printed (the step lines, log records, the worker
    lines Ray forwards with print(file=sys.stderr)) goes above it instead of being glued onto its
    end. The bar itself keeps the real stderr it was created with."""
    wrappers = {id(sys.stdout): _AboveBar(sys.stdout, bar), id(sys.stderr): _AboveBar(sys.stderr, bar)}
    saved = sys.stdout, sys.stderr
    # Hydra's console handler holds the real stdout, so print's redirection alone would miss it.
    handlers = [h for h in logging.getLogger().handlers
                if type(h) is logging.StreamHandler and id(h.stream) in wrappers]
    old_streams = [h.setStream(wrappers[id(h.stream)]) for h in handlers]
    sys.stdout, sys.stderr = wrappers[id(saved[0])], wrappers[id(saved[1])]
    try:
        yield
    finally:
        sys.stdout, sys.stderr = saved
        for handler, stream in zip(handlers, old_streams):
            handler.setStream(stream)
        for wrapper in wrappers.values():  # a last line without its newline
            wrapper.stream.write(wrapper.pending)
