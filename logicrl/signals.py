"""Signals: a stop request ends a run at the next step boundary, with a checkpoint; a second one,
or one that comes when there is no step to finish, stops at once.

SIGUSR1 (SLURM's `--signal=B:USR1@<lead>`, forwarded by slurm/train.sbatch) and SIGTERM (some
sites preempt with it; `kill`) are the stop requests. Inside the trainer's step loop
(`stop_at_step_end`) the first one is only noted: the step in flight finishes, a checkpoint is
written and the trainer raises `Preempted` (main_ppo: exit 75, which the wrapper requeues).
Otherwise, or the second time (but for the other stop signal within SAME_REQUEST_S: one request
delivered twice), the handler raises `Stopped` where the process stands: saves in
flight are dropped (trainer/checkpoint.saving), Ray is shut down, and main_ppo prints one line.

Python runs a handler only between bytecodes of the main thread, and a signal that arrives again
before its handler ran is delivered once: two requests must be far enough apart to count as two.

A handler that raises inside a callback whose exceptions Python ignores (logging's lock release
after a fork, while Ray forks its daemons) is lost and the process goes on: `stop_raised_again`
raises it once the code it guards returns. Ray's `ray.init` would install its own SIGTERM handler
(sys.exit, as easily lost); controller/cluster.py keeps ours in place while it runs, and installs
it again after, over the C++ one of Ray's core worker.
"""

from __future__ import annotations

import os
import signal
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

STOP_SIGNALS = (signal.SIGTERM, signal.SIGUSR1)

# On a SLURM time limit or TERM preemption the driver gets TERM from SLURM and, a moment later, the
# wrapper's forwarded USR1: the other kind of stop signal this soon after is the same request.
SAME_REQUEST_S = 2.0
# GNU timeout sends its signal to the command and then to the command's whole process group, the
# command again included: the same signal this soon after is that one request, not a second.
ECHO_S = 0.5

_at_step_end = False  # the trainer's loop is running and can stop at a step boundary
_requested: int | None = None  # the signal that asked it to
_requested_at = 0.0
_stopped_by: int | None = None  # the signal whose handler raised Stopped


class Stopped(KeyboardInterrupt):
    """The process was asked to stop (SIGTERM, SIGUSR1) and stopped at once. A KeyboardInterrupt,
    so that no `except Exception` on the way swallows it, and because Ray's blocking calls
    (ray.get, ray.wait) re-raise only KeyboardInterrupt from a signal handler as itself; anything
    else comes out as a SystemError."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


class Preempted(Exception):
    """The run stopped at a step boundary after a stop request, with that step's checkpoint."""

    def __init__(self, signum: int, step: int, checkpoint: str):
        self.signum, self.step, self.checkpoint = signum, step, checkpoint
        super().__init__(f"stopped by {signal.Signals(signum).name} after step {step}, with its checkpoint "
                         f"{checkpoint}")


def _on_signal(signum, frame):
    global _requested, _requested_at
    if _at_step_end and _requested is None:
        _requested, _requested_at = signum, time.monotonic()  # no logging: the handler may run inside logging's lock
        # A step can take minutes: say at once that the request was heard (os.write takes no lock).
        os.write(2, f"\nlogicrl: {signal.Signals(signum).name}: finishing this step, then saving a checkpoint "
                    "(send it again to stop at once)\n".encode())
        return
    since = time.monotonic() - _requested_at
    if _at_step_end and (since < ECHO_S or (signum != _requested and since < SAME_REQUEST_S)):
        return
    global _stopped_by
    _stopped_by = signum
    raise Stopped(signum)


def stop_on_signals() -> None:
    if threading.current_thread() is threading.main_thread():  # signal handlers live there only
        for signum in STOP_SIGNALS:
            signal.signal(signum, _on_signal)


@contextmanager
def stop_at_step_end() -> Iterator[None]:
    """While inside, the first stop request waits for `requested()` to be read at a step's end."""
    global _at_step_end, _requested
    _at_step_end, _requested = True, None
    try:
        yield
    finally:
        _at_step_end = False


def stop_request_of(err: BaseException) -> Stopped | None:
    """The Stopped that `err` stands for: itself, or the plain KeyboardInterrupt that a Ray blocking
    call raises in its place when our handler raised Stopped inside it; None for a real Ctrl-C."""
    if isinstance(err, Stopped):
        return err
    if isinstance(err, KeyboardInterrupt) and _stopped_by is not None:
        return Stopped(_stopped_by)
    return None


@contextmanager
def stop_raised_again() -> Iterator[None]:
    """Around code in which our handler may run inside a callback that swallows what it raises: a
    stop it raised there is raised again at the end, also in place of another error it caused."""
    global _stopped_by
    _stopped_by = None
    try:
        yield
    except KeyboardInterrupt:
        raise
    except BaseException:
        if _stopped_by is not None:
            raise Stopped(_stopped_by) from None
        raise
    if _stopped_by is not None:
        raise Stopped(_stopped_by)


def requested() -> int | None:
    """The signal that asked the loop to stop, if one did."""
    return _requested
