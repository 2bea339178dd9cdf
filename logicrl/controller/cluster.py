"""The Ray cluster a run uses: its own private one, or one it was told to join.

Without `trainer.ray_address` (or RAY_ADDRESS) every run starts a private local cluster, whatever
else runs on the machine: `ray.init()` with no address would join the last cluster `ray start`
left in /tmp/ray (anyone's, e.g. another job's on a shared node) and then refuse the resources
asked of it. Joining is explicit: the SLURM wrapper (slurm/train.sbatch) passes its own job's head.
Token auth follows the environment (RAY_AUTH_MODE, RAY_AUTH_TOKEN_PATH), which Ray reads itself;
a cluster that refuses the driver is named with those two variables.

A private cluster cannot outlive its GCS server (no GCS fault tolerance without Redis): Ray's own
processes wait 60 s for it, then end themselves with "Failed to connect to GCS" (the driver too,
from C++, so no line of logicrl's and no clean-up), and its two agents outlive everything. So a
thread watches the GCS and raylet processes (`_GcsWatch`): the wait for the ranks raises ClusterLost at once,
and if the driver is blocked elsewhere the thread itself ends the run after GCS_GRACE_S.
"""

from __future__ import annotations

import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager

import psutil
import ray
import ray._private.utils as ray_utils

from logicrl.controller.private import PortsTaken, reaper_pid, start_private, stop_reaper
from logicrl.errors import BadInput
from logicrl.signals import Stopped, requested, stop_on_signals, stop_raised_again

# How long a joined cluster may take to show the nodes a run asks for: a SLURM job's workers
# join the head some seconds after it starts.
NODES_TIMEOUT_S = 120
# After the GCS ends, how long the controller's own way out (ClusterLost from a wait, then stop_ray)
# may take before the watch thread ends the run itself. Below Ray's 60 s: past that Ray's C++ code
# kills the driver without a word.
GCS_GRACE_S = 20
WATCH_EVERY_S = 0.5
EXIT_CLUSTER_LOST = 1  # main_ppo's EXIT_FAILED: the cluster, not the input, failed
EXIT_PREEMPTED, EXIT_SIGTERM = 75, 143  # main_ppo's, for a stop signal that reached the cluster too
# Whether a private cluster starts Ray's dashboard (trainer.ray_dashboard; main_ppo sets it).
dashboard = False


class ClusterLost(RuntimeError):
    """The run's private Ray cluster lost its GCS server: no call into the cluster can complete,
    so the run ends. The message is the line to print."""


class _GcsWatch(threading.Thread):
    """Polls the private cluster's GCS process; remembers every process that descends from the
    driver (Ray's agents are re-parented to init when the raylet dies, and ignore SIGTERM, so
    stop_ray must know them from before)."""

    def __init__(self, gcs: psutil.Process, logs: str, raylet: psutil.Process | None = None):
        super().__init__(name="logicrl-gcs-watch", daemon=True)
        self.gcs, self.logs, self.lost = gcs, logs, None
        # A one-node cluster's only raylet is as vital: a SIGTERM for every process of the run leaves
        # the GCS alive but deaf (it never answers again), and ends the raylet.
        self.raylet = raylet
        self.started: dict[int, psutil.Process] = {}
        self.stopping = threading.Event()
        self.remember()

    def remember(self) -> None:
        for proc in descendants():
            self.started.setdefault(proc.pid, proc)

    def run(self) -> None:
        polls = 0
        while alive(self.gcs) and (self.raylet is None or alive(self.raylet)):
            if self.stopping.wait(WATCH_EVERY_S):
                return
            polls += 1
            if polls % 10 == 0:  # new workers (the ranks, Ray's idle ones) start after ray.init
                self.remember()
        what, log = ("GCS server", "gcs_server.out") if not alive(self.gcs) else ("raylet", "raylet.out")
        ended = self.gcs if what == "GCS server" else self.raylet
        self.lost = (f"Ray's {what} (pid {ended.pid}) of this run's private Ray cluster ended mid-run "
                     f"(killed, or out of memory: see {log} in {self.logs}); the cluster cannot work "
                     "without it, so the run stopped and its Ray processes were ended: run the same command "
                     "again to resume from the newest checkpoint")
        if self.stopping.wait(GCS_GRACE_S):
            return
        # The controller is blocked in a call that will not return (e.g. removing a placement
        # group): print the line and end the processes here, before Ray's own fatal exit.
        line, code = self.lost, EXIT_CLUSTER_LOST
        if (signum := requested()) is not None:  # a stop signal reached the cluster too (a whole cgroup's)
            line, code = signalled_line(signum), signalled_code(signum)
        print(f"error: {line}", file=sys.stderr, flush=True)
        kill_all(self.processes())
        os._exit(code)

    def processes(self) -> list[psutil.Process]:
        self.remember()
        return list(self.started.values())


_watch: _GcsWatch | None = None


def resume_hint() -> str:
    """What is intact and how to resume: main_ppo names the newest checkpoint here."""
    return "run the same command to resume from the newest checkpoint"


def signalled_line(signum: int) -> str:
    """The run's line when a stop signal reached Ray's processes as well as the driver."""
    return (f"stopped by {signal.Signals(signum).name}, which reached this run's Ray processes too (the whole "
            f"container, cgroup or job step was signalled), so the step in flight was lost; {resume_hint()}")


def signalled_code(signum: int) -> int:
    return EXIT_PREEMPTED if signum == signal.SIGUSR1 else EXIT_SIGTERM


def descendants() -> list[psutil.Process]:
    """This driver's descendants but the reaper, which ends the rest once the driver closes its pipe, and those
    it had before its cluster started (`_earlier`)."""
    return [p for p in psutil.Process().children(recursive=True) if p.pid != reaper_pid() and p not in _earlier]


# The processes this driver had started before its cluster (a notebook's, a test harness's launch server):
# not the cluster's, so stop_ray neither waits for them nor kills them. psutil tells a reused pid apart.
_earlier: set[psutil.Process] = set()


def alive(proc: psutil.Process) -> bool:
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def check_cluster() -> None:
    """Raise ClusterLost if the private cluster's GCS server has ended (cheap: a flag)."""
    if _watch is not None and _watch.lost:
        raise ClusterLost(_watch.lost)


def cluster_lost() -> bool:
    return _watch is not None and _watch.lost is not None


def watch_gcs() -> None:
    """Start watching the GCS server that ray.init just started (a descendant of this driver)."""
    global _watch
    gcs = [p for p in descendants() if p.name() == "gcs_server"]
    raylet = [p for p in descendants() if p.name() == "raylet"]
    if not gcs:
        return  # not one this driver started: nothing to watch
    try:  # Ray has no public name for it; only the message uses it
        logs = ray._private.worker._global_node.get_logs_dir_path()
    except AttributeError:
        logs = "Ray's session directory (/tmp/ray/session_latest/logs)"
    _watch = _GcsWatch(gcs[0], logs, raylet[0] if raylet else None)
    _watch.start()


def join_address(configured: str | None) -> tuple[str | None, str]:
    """The cluster to join and the key that named it: trainer.ray_address, else RAY_ADDRESS, else
    None (start a private one)."""
    if configured:
        return configured, "trainer.ray_address"
    return os.environ.get("RAY_ADDRESS") or None, "RAY_ADDRESS"


def ensure_ray(n_ranks: int, nnodes: int, use_cuda: bool, ray_address: str | None = None) -> None:
    """Start a private cluster with room for `n_ranks` ranks, or join the one named by
    `ray_address` or RAY_ADDRESS and check that it has `nnodes` nodes with room for them."""
    global _earlier
    if ray.is_initialized():
        return
    _earlier = set(psutil.Process().children(recursive=True))
    address, key = join_address(ray_address)
    if address:
        reachable(address, key)
        try:
            with signals_kept_while_ray_starts():
                ray.init(address=address, log_to_driver=True)
        except (ConnectionError, RuntimeError, ValueError) as err:
            raise BadInput(f"{key}={address}: cannot join that Ray cluster "
                           f"({' '.join(str(err).split())[:160]}): if it uses token auth, set RAY_AUTH_MODE=token "
                           "and RAY_AUTH_TOKEN_PATH as on its nodes; or leave trainer.ray_address and RAY_ADDRESS "
                           "unset to start a private one here") from None
    else:
        # address="local": a new cluster even when one is running here, in sessions of its own, on
        # loopback, with a reaper (controller/private.py). At least one CPU per rank even on a
        # 2-core machine: ranks mostly wait on each other, and each rank's thread count is set
        # explicitly (controller/placement.py). The raylet starts one worker ahead per rank, not per CPU:
        # the ranks are the cluster's only workers (placement probes a private cluster from the driver).
        # TOKENIZERS_PARALLELISM=false in the environment the daemons (and so the workers) inherit, set
        # only while they start, rather than as the job's runtime_env: with one, the job's tasks and
        # ranks could not use the workers the raylet starts with, and each would start its own.
        user_value = os.environ.get("TOKENIZERS_PARALLELISM")
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        try:
            with signals_kept_while_ray_starts():
                start_private(ray.init, stop_ray, workers=n_ranks, num_cpus=max(os.cpu_count() or 1, n_ranks),
                              include_dashboard=dashboard, log_to_driver=True)
        except PortsTaken as err:  # main_ppo prints a ClusterLost's message as the run's one line
            raise ClusterLost(str(err)) from None
        finally:
            if user_value is None:
                os.environ.pop("TOKENIZERS_PARALLELISM", None)
            else:
                os.environ["TOKENIZERS_PARALLELISM"] = user_value
        watch_gcs()
    # Ray's core worker, connected by ray.init, installs a C++ SIGTERM handler under Python's: ours again.
    stop_on_signals()
    check_room(n_ranks, use_cuda)
    if nnodes > 1:
        wait_for_nodes(nnodes, n_ranks // nnodes, use_cuda)


@contextmanager
def signals_kept_while_ray_starts() -> Iterator[None]:
    """ray.init installs a SIGTERM handler that calls sys.exit; a SystemExit raised while Ray forks
    a daemon can be swallowed (logging's at-fork lock release) and the run goes on. Ours stays in
    place instead, and a stop that was swallowed is raised once ray.init returns (logicrl/signals.py)."""
    install, hook = ray_utils.set_sigterm_handler, sys.unraisablehook

    def stop_kept_quiet(unraisable) -> None:
        # The swallowed stop would also be printed as "Exception ignored in: <function _releaseLock>" and its
        # traceback, above the run's one line: it is raised again below instead.
        if not isinstance(unraisable.exc_value, Stopped):
            hook(unraisable)

    ray_utils.set_sigterm_handler = lambda handler: None
    sys.unraisablehook = stop_kept_quiet
    try:
        with stop_raised_again():
            yield
    finally:
        ray_utils.set_sigterm_handler, sys.unraisablehook = install, hook


def stop_ray() -> None:
    """ray.shutdown, then end what is left of the processes this driver started: its descendants
    (the GCS, the raylet, the workers), found before the raylet dies and orphans the workers, and
    those the GCS watch saw descend from it; never by name, so other clusters on the machine are
    left alone, as is a joined cluster. With the GCS gone they are killed first: they only wait for it."""
    global _watch
    mine = {p.pid: p for p in descendants()}
    watch, _watch = _watch, None
    if watch is not None:
        mine.update({p.pid: p for p in watch.processes() if p.pid not in mine})
        if watch.lost:
            kill_all(list(mine.values()))
        else:
            watch.stopping.set()  # ray.shutdown ends the GCS: not a loss
    if ray.is_initialized():
        ray.shutdown()  # ~5 s without a GCS (the driver's core worker gives up on it)
    _, left = psutil.wait_procs(list(mine.values()), timeout=5)
    kill_all(left)
    stop_reaper()  # ends what ray.shutdown left in the cluster's sessions (orphans this driver never saw)
    if watch is not None:
        watch.stopping.set()  # after a loss it stayed armed, in case the shutdown hung on the GCS


def kill_all(procs: list[psutil.Process]) -> None:
    for proc in procs:
        try:
            proc.kill()  # psutil checks the process is still the one it saw (pid reuse)
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(procs, timeout=5)


def reachable(address: str, key: str = "trainer.ray_address", timeout_s: float = 5.0) -> None:
    """A host:port address that answers, or a BadInput in seconds: ray.init would retry an
    unreachable one for minutes. Other forms ("auto", ray://) are left to Ray."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or "://" in address:
        return
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as err:
        raise BadInput(f"{key}={address}: no Ray cluster answers there ({err.strerror or err}): "
                       "start it (ray start --head) or leave trainer.ray_address and RAY_ADDRESS unset to start "
                       "one here") from None


def need(n_ranks: int, use_cuda: bool) -> dict[str, float]:
    return {"CPU": n_ranks, **({"GPU": n_ranks} if use_cuda else {})}


def check_room(n_ranks: int, use_cuda: bool) -> None:
    """Refuse a cluster that can never hold the ranks, before anything waits on it."""
    asked = need(n_ranks, use_cuda)
    have = ray.cluster_resources()
    if any(have.get(k, 0) < v for k, v in asked.items()):
        raise BadInput(f"trainer.n_gpus={n_ranks} needs {resources(asked)} but the Ray cluster has "
                       f"{resources({k: have.get(k, 0) for k in asked})}: lower trainer.n_gpus or add nodes")


def roomy_nodes(per_node: int, use_cuda: bool) -> list[dict]:
    """Alive nodes whose resources can hold `per_node` ranks."""
    asked = need(per_node, use_cuda)
    return [n for n in ray.nodes()
            if n["Alive"] and all(n["Resources"].get(k, 0) >= v for k, v in asked.items())]


def wait_for_nodes(nnodes: int, per_node: int, use_cuda: bool) -> None:
    """Wait (bounded) until `nnodes` nodes can each hold `per_node` ranks."""
    deadline = time.monotonic() + NODES_TIMEOUT_S
    while len(found := roomy_nodes(per_node, use_cuda)) < nnodes:
        if time.monotonic() > deadline:
            raise BadInput(f"trainer.nnodes={nnodes} needs {nnodes} Ray nodes with "
                           f"{resources(need(per_node, use_cuda))} each; after {NODES_TIMEOUT_S} s the cluster has "
                           f"{len(found)} such of "
                           f"{sum(n['Alive'] for n in ray.nodes())} alive: lower trainer.nnodes or start more nodes")
        time.sleep(1)


def resources(r: dict) -> str:
    return ", ".join(f"{v:g} {k}" for k, v in r.items())
