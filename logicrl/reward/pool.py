"""Scoring responses with a bound on each reward call: a pool of processes that can be ended.

    scorer = make_scorer(custom=("my_reward.py", "compute_score"), timeout_s=30, timeout_score=0.0)
    results, timeouts = scorer.score(rows)    # rows: (data_source, solution_str, ground_truth, extra_info)

A thread that runs past its time cannot be stopped, so a reward that hangs (a regex that backtracks for
hours, math-verify on a pathological expression, a custom reward waiting on a network) would hang the run.
Each call runs in a worker process instead; one past `timeout_s` is killed (SIGKILL: the reward may ignore
anything gentler) and replaced, and its response scores `timeout_score`, counted in `timeouts`. The
workers are plain `python -c` children on a socket pair (not multiprocessing's spawn, which re-imports the
entry point in every child); they ignore Ctrl-C (the driver handles it) and die with the driver (Linux's
parent-death signal). `timeout_s=None` scores in this process, unbounded, as before.

A reward's bad value (NaN, inf, None, text, a list, no "score"), an exception or a `sys.exit` in it ends
the run with one line naming the function, the response and the value (`RewardFailed`, a BadInput).
"""

from __future__ import annotations

import collections
import os
import pickle
import signal
import socket
import subprocess
import sys
import time
from multiprocessing.connection import Connection, wait
from typing import Any

from logicrl.errors import BadInput
from logicrl.reward import REWARD_FNS, normalize_score

# Workers for the driver's rewards: rule rewards are milliseconds each, so a few processes keep up with
# any batch, and the ranks need the cores more.
MAX_WORKERS = 4
WAIT_SLICE_S = 0.2  # the driver's signal handlers run between waits (logicrl/signals.py)
# A worker's start (Python, the rewards' imports, the custom reward's file) is not the reward's time: the
# timeout runs from its "ready", and the start has this bound of its own.
START_S = 120.0
READY = "ready"

Row = tuple  # (data_source, solution_str, ground_truth, extra_info)


class RewardFailed(BadInput):
    """A reward function returned something that is not a score, raised, or exited."""


def reward_for(data_source: str, custom) -> tuple[Any, str]:
    """The function that scores `data_source` (the custom one when given) and the name errors use."""
    if custom is not None:
        code = getattr(custom, "__code__", None)
        where = f" in {code.co_filename}" if code is not None else ""
        return custom, f"custom reward {getattr(custom, '__qualname__', custom)!s}{where}"
    fn = REWARD_FNS.get(data_source)
    if fn is None:
        raise RewardFailed(f"no reward for data_source={data_source!r}; known: {sorted(REWARD_FNS)}. Register one with "
                           f"@logicrl.reward.register({data_source!r}) or set reward.custom.path/name")
    return fn, f"reward for data_source={data_source!r} ({fn.__module__}.{fn.__qualname__})"


def score_row(row: Row, custom=None) -> tuple[bool, Any]:
    """(True, {"score": float, ...}) or (False, what went wrong: the function's name and the value)."""
    data_source, text, ground_truth, extra_info = row
    fn, name = reward_for(data_source, custom)
    try:
        result = fn(data_source=data_source, solution_str=text, ground_truth=ground_truth, extra_info=extra_info)
    except SystemExit as exit_:
        return False, f"{name} called sys.exit({exit_.code!r})"
    except Exception as err:  # noqa: BLE001 - whatever the user's code raises, it is named in the line
        return False, f"{name} raised {type(err).__name__}: {' '.join(str(err).split())[:200]}"
    try:
        return True, normalize_score(result, name)
    except (TypeError, ValueError) as err:
        return False, str(err)


def failed_line(detail: str, index: int, row: Row) -> str:
    data_source, text, ground_truth, _ = row
    return (f"{detail}, on response {index} of the batch (data_source={data_source!r}, ground_truth="
            f"{str(ground_truth)[:60]!r}, response {text[:60]!r}): a reward returns a finite float or a dict with "
            "a finite 'score' for any text; fix the function")


class InlineScorer:
    """reward.timeout_s=null: every reward in this process, one after the other."""

    def __init__(self, custom=None):
        self.custom = custom

    def score(self, rows: list[Row]) -> tuple[list[dict], int]:
        results = []
        for i, row in enumerate(rows):
            ok, value = score_row(row, self.custom)
            if not ok:
                raise RewardFailed(failed_line(value, i, row))
            results.append(value)
        return results, 0

    def close(self) -> None:
        pass


class Worker:
    def __init__(self, custom_file: tuple[str, str] | None):
        ours, theirs = socket.socketpair()
        code = f"from logicrl.reward.pool import serve; serve({theirs.fileno()}, {custom_file!r})"
        self.proc = subprocess.Popen([sys.executable, "-c", code], pass_fds=(theirs.fileno(),),
                                     stdin=subprocess.DEVNULL)
        theirs.close()
        self.conn = Connection(ours.detach())
        self.started = time.monotonic()

    def kill(self) -> None:
        self.conn.close()
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()


class PoolScorer:
    """Rewards in up to MAX_WORKERS processes, each call bounded by `timeout_s` (see the module's docstring)."""

    def __init__(self, timeout_s: float, timeout_score: float, custom_file: tuple[str, str] | None = None,
                 workers: int | None = None):
        self.timeout_s, self.timeout_score, self.custom_file = timeout_s, timeout_score, custom_file
        self.size = workers or max(1, min(MAX_WORKERS, os.cpu_count() or 1))
        self.idle: list[Worker] = []  # ready, kept across calls
        self.starting: dict[Connection, Worker] = {}  # started lazily, until their "ready"

    def _ready(self, conn: Connection) -> None:
        worker = self.starting.pop(conn)
        try:
            hello = conn.recv()
        except (EOFError, OSError):
            code = worker.proc.wait()
            worker.kill()
            raise RewardFailed(f"a reward process could not start (exit code {code}): run `python -c \"from "
                               f"logicrl.reward.custom import load_custom_reward as l; l*{self.custom_file!r}\"` to "
                               "see why") from None
        assert hello == READY, hello
        self.idle.append(worker)

    def score(self, rows: list[Row]) -> tuple[list[dict], int]:
        results: list[dict | None] = [None] * len(rows)
        todo, busy, timeouts = collections.deque(range(len(rows))), {}, 0
        while len(self.idle) + len(self.starting) < min(self.size, len(rows)):
            worker = Worker(self.custom_file)
            self.starting[worker.conn] = worker
        try:
            while todo or busy:
                while todo and self.idle:
                    worker, i = self.idle.pop(), todo.popleft()
                    try:
                        worker.conn.send((i, rows[i]))
                    except OSError:  # it died while idle (killed from outside): replace it, the row waits
                        worker.kill()
                        fresh = Worker(self.custom_file)
                        self.starting[fresh.conn] = fresh
                        todo.appendleft(i)
                        continue
                    busy[worker.conn] = (worker, i, time.monotonic())
                now = time.monotonic()
                deadlines = [started + self.timeout_s for _, _, started in busy.values()]
                deadlines += [w.started + START_S for w in self.starting.values()]
                left = min(deadlines) - now
                for conn in wait([*busy, *self.starting], timeout=max(0.0, min(left, WAIT_SLICE_S))):
                    if conn in self.starting:
                        self._ready(conn)
                        continue
                    worker, i, _ = busy.pop(conn)
                    try:
                        ok, value = conn.recv()
                    except (EOFError, OSError):
                        code = worker.proc.wait()
                        worker.kill()
                        raise RewardFailed(failed_line(f"the reward's process ended (exit code {code}: os._exit, or "
                                                       "killed)", i, rows[i])) from None
                    self.idle.append(worker)
                    if not ok:
                        raise RewardFailed(failed_line(value, i, rows[i]))
                    results[i] = value
                now = time.monotonic()
                for conn, (worker, i, started) in list(busy.items()):
                    if now - started > self.timeout_s:
                        del busy[conn]
                        worker.kill()
                        fresh = Worker(self.custom_file)
                        self.starting[fresh.conn] = fresh
                        results[i], timeouts = {"score": float(self.timeout_score)}, timeouts + 1
                if any(now - w.started > START_S for w in self.starting.values()):
                    raise RewardFailed(f"a reward process did not start in {START_S:.0f} s (the custom reward's file "
                                       f"{self.custom_file and self.custom_file[0]} hangs as it is imported?)")
        finally:
            for worker, _, _ in busy.values():  # their answers would reach the next call: end them
                worker.kill()
        return results, timeouts

    def close(self) -> None:
        for worker in [*self.idle, *self.starting.values()]:
            worker.kill()
        self.idle, self.starting = [], {}


def make_scorer(custom: tuple[str, str] | None, timeout_s: float | None, timeout_score: float):
    """The scorer reward.* asks for: `custom` is (reward.custom.path, reward.custom.name) or None."""
    if timeout_s is None:
        from logicrl.reward.custom import load_custom_reward

        return InlineScorer(load_custom_reward(*custom) if custom else None)
    return PoolScorer(timeout_s, timeout_score, custom)


def serve(fd: int, custom_file: tuple[str, str] | None) -> None:
    """A worker process: score (index, row) requests until the driver closes the socket."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C reaches the whole foreground group; the driver acts
    _die_with_parent()
    custom = None
    if custom_file is not None:
        from logicrl.reward.custom import load_custom_reward

        custom = load_custom_reward(*custom_file)
    conn = Connection(fd)
    conn.send(READY)
    while True:
        try:
            index, row = conn.recv()
        except (EOFError, OSError):
            return
        try:
            answer = score_row(row, custom)
        except BadInput as err:
            answer = (False, str(err))
        try:
            conn.send(answer)
        except (pickle.PicklingError, TypeError, AttributeError) as err:
            conn.send((False, f"{reward_for(row[0], custom)[1]} returned a result that cannot be sent back from its "
                              f"process ({type(err).__name__}: {err}); return plain numbers"))


def _die_with_parent() -> None:
    """Linux: SIGKILL this process when the driver dies, even while the reward is blocked in a call."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        if os.getppid() == 1:  # the driver died before prctl took effect
            os._exit(0)
    except (OSError, AttributeError):
        pass
