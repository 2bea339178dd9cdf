"""Starting a private one-machine Ray cluster that a signal for the launch does not reach, that
listens on loopback only, and that a watchdog ends whatever way the driver ends.

Ray starts its daemons (GCS, raylet, dashboard, log monitor) as children in the driver's process
group, so `timeout`, `docker stop`, `kill -- -PGID` and a terminal's Ctrl-C signal them with the
driver: the daemons die while the driver is still saving the step in flight. Here each one starts
in a session of its own (Ray has no option for it: its Popen class is wrapped while ray.init runs),
and the raylet's workers and agents are born into the raylet's. Each session's pid goes to the
reaper (controller/reaper.py), which kills the sessions' processes when the driver is gone.

Ray binds its servers to loopback only when the node's address is 127.0.0.1, and ray.init replaces
that address by the machine's routable one unless Ray believes clusters are off (its constant for
Windows and macOS, set here while ray.init runs). A joined cluster is never touched by any of this.
"""

from __future__ import annotations

import re
import subprocess
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import ray._private.node as ray_node
import ray._private.ray_constants as ray_constants
import ray._private.services as ray_services

from logicrl.controller.ports import port_holder

REAPER = Path(__file__).with_name("reaper.py")
LOOPBACK = "127.0.0.1"
# ray.init attempts: each port is the OS's pick when a server binds (Ray 2.60 passes 0), so a retry
# is for what is left of a fixed one (the dashboard's, RAY_GCS_SERVER_PORT from the environment).
START_ATTEMPTS = 3
REAPER_WAIT_S = 15
# The raylet's flag for the Python workers it starts ahead (services.start_raylet sets it to the CPU count).
PRESTART = "--num_prestart_python_workers="

_reaper: subprocess.Popen | None = None


class PortsTaken(RuntimeError):
    """A private cluster could not start on a port in use, START_ATTEMPTS times: the line to print."""


def start_reaper() -> subprocess.Popen:
    """The watchdog, in a session of its own, reading session ids from a pipe only this driver holds."""
    global _reaper
    _reaper = subprocess.Popen([sys.executable, str(REAPER)], stdin=subprocess.PIPE, text=True,
                               stdout=subprocess.DEVNULL, start_new_session=True)
    return _reaper


def watch(pid: int) -> None:
    """Hand the session led by `pid` to the reaper."""
    if _reaper is not None and _reaper.stdin is not None:
        try:
            _reaper.stdin.write(f"{pid}\n")
            _reaper.stdin.flush()
        except (BrokenPipeError, ValueError):  # the reaper was killed: nothing to tell
            pass


def reaper_pid() -> int | None:
    """The reaper's pid: a descendant of the driver that the driver must not wait for nor kill."""
    return _reaper.pid if _reaper is not None else None


def stop_reaper() -> None:
    """Close the pipe: the reaper kills what is left of the cluster's sessions, then exits."""
    global _reaper
    reaper, _reaper = _reaper, None
    if reaper is None:
        return
    try:
        reaper.stdin.close()
    except (BrokenPipeError, OSError):
        pass
    try:
        reaper.wait(timeout=REAPER_WAIT_S)
    except subprocess.TimeoutExpired:
        reaper.kill()
        reaper.wait()


@contextmanager
def own_sessions_on_loopback(dashboard: bool = False, workers: int | None = None) -> Iterator[None]:
    """While ray.init starts a cluster: each daemon in a new session, handed to the reaper, and
    127.0.0.1 kept as the node's address. Without the dashboard, neither its head process (Ray starts
    it anyway, serving usage statistics only) nor the autoscaler's monitor (one machine: nothing to scale).
    `workers`: how many Python workers the raylet starts ahead (Ray's default: one per CPU, each an
    interpreter importing Ray, idle unless a rank takes it), None for Ray's default."""
    popen, clusters = ray_services.ConsolePopen, ray_constants.ENABLE_RAY_CLUSTER
    api_server, monitor = ray_node.Node.start_api_server, ray_node.Node.start_monitor

    class OwnSession(popen):
        def __init__(self, args, *rest, **kwargs):
            if workers is not None and isinstance(args, list):  # the raylet's command line
                args = [f"{PRESTART}{workers}" if str(a).startswith(PRESTART) else a for a in args]
            kwargs["start_new_session"] = True
            super().__init__(args, *rest, **kwargs)
            watch(self.pid)

    ray_services.ConsolePopen, ray_constants.ENABLE_RAY_CLUSTER = OwnSession, False
    if not dashboard:
        ray_node.Node.start_api_server = ray_node.Node.start_monitor = lambda self, **kwargs: None
    try:
        yield
    finally:
        ray_services.ConsolePopen, ray_constants.ENABLE_RAY_CLUSTER = popen, clusters
        ray_node.Node.start_api_server, ray_node.Node.start_monitor = api_server, monitor


def start_private(init: Callable[..., object], cleanup: Callable[[], None], workers: int | None = None,
                  **kwargs) -> None:
    """`init(address="local", ...)` on loopback in own sessions, watched by a reaper, `workers` Python
    workers started ahead; a start that fails on a port in use is cleaned up and tried again (bounded);
    one that fails still names the port and who holds it."""
    for attempt in range(1, START_ATTEMPTS + 1):
        start_reaper()
        try:
            with own_sessions_on_loopback(bool(kwargs.get("include_dashboard")), workers):
                init(address="local", _node_ip_address=LOOPBACK, **kwargs)
            return
        except (RuntimeError, ConnectionError, TimeoutError, OSError) as err:
            cleanup()
            stop_reaper()
            port = port_in_use(str(err))
            if port is None:
                raise
            if attempt == START_ATTEMPTS:
                which = f"port {port} ({port_holder(port)})" if port else "a port (Ray's message names none)"
                raise PortsTaken(f"Ray's private cluster could not bind {which} in {START_ATTEMPTS} tries: "
                                 f"{' '.join(str(err).split())[:200]}") from None


def port_in_use(text: str) -> int | None:
    """The port an "address already in use" message names (0: it names none), or None for another failure.
    The port is read after an address (`127.0.0.1:43077`, `[::]:43077`) or after "port": Ray's messages
    carry log timestamps (`06:54:06`) that a bare `:N` would mistake for one."""
    if not re.search(r"already in use|EADDRINUSE|Failed to bind|bind.*failed|Failed to start the grpc server", text,
                     re.I):
        return None
    found = re.search(r"(?:\d{1,3}(?:\.\d{1,3}){3}|\]|localhost):(\d{1,5})\b|\bport (?:is |= ?)?(\d{1,5})\b", text,
                      re.I)
    return int(found.group(1) or found.group(2)) if found else 0
