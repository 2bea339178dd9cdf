"""The watchdog of a private Ray cluster: ends every process of it once its driver is gone.

    python logicrl/controller/reaper.py      # started by controller/private.py, stdin a pipe from the driver

Each Ray daemon the driver starts leads a session of its own (private.py); the driver writes each
one's pid to this process's stdin as it starts. When stdin ends (the driver closed it after
ray.shutdown, or the kernel did because the driver died, SIGKILL included), every process whose
session is one of those is killed, until none is left or KILL_FOR_S passed. Processes are found by
session id, never by name, so other Ray clusters on the machine are left alone. Run as a script:
stdlib only, so it starts in tens of milliseconds; it runs in a session of its own, so a signal
for the launch's process group does not reach it.
"""

from __future__ import annotations

import os
import signal
import sys
import time

KILL_FOR_S = 10.0


def members(sessions: set[int]) -> list[int]:
    """Pids in one of `sessions`, this process aside (it leads a session of its own)."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            if os.getsid(int(entry)) in sessions:
                found.append(int(entry))
        except OSError:  # ended meanwhile
            pass
    return found


def end(sessions: set[int]) -> None:
    deadline = time.monotonic() + KILL_FOR_S
    while (pids := members(sessions)) and time.monotonic() < deadline:
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)  # nothing to save: the driver that owned them is gone
            except OSError:
                pass
        time.sleep(0.1)


def main() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # its job is to outlive the others
    sessions: set[int] = set()
    for line in sys.stdin:
        if line.strip().isdigit():
            sessions.add(int(line))
    end(sessions)


if __name__ == "__main__":
    main()
