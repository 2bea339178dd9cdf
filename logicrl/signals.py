"""SIGTERM as an exception, so a stopped run unwinds like Ctrl-C: saves in flight are dropped
(trainer/checkpoint.saving), Ray is shut down, and main_ppo prints one line (exit 143).

Ray's `ray.init` installs its own SIGTERM handler (exit at once, after killing its processes);
`stop_on_sigterm` is called again right after it, so for the rest of the run the signal is ours.
"""

from __future__ import annotations

import signal
import threading


class Stopped(KeyboardInterrupt):
    """The process was asked to stop (SIGTERM). A KeyboardInterrupt, so that no `except Exception`
    on the way swallows it, and because Ray's blocking calls (ray.get, ray.wait) re-raise only
    KeyboardInterrupt from a signal handler as itself; anything else comes out as a SystemError."""

    def __init__(self, signum: int):
        super().__init__(signal.Signals(signum).name)
        self.signum = signum


def _raise(signum, frame):
    raise Stopped(signum)


def stop_on_sigterm() -> None:
    if threading.current_thread() is threading.main_thread():  # signal handlers live there only
        signal.signal(signal.SIGTERM, _raise)
