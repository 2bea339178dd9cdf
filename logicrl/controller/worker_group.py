"""One Ray actor per rank, placed with a placement group, called together.

The workers are plain classes (tests build them directly); this module starts them where
controller/placement.py put their bundles and fans calls out: `call` sends the same arguments to
every rank, `dispatch` sends rank r its own shard. Each has a form that returns at once
(`call_async`, `dispatch_async`: a handle whose `result()` waits, controller/pending.py); the blocking
forms wait on it. Ray runs an actor's calls in the order they were issued, so calls issued without
waiting still reach each rank in order. On a machine without CUDA the ranks are CPU processes over
gloo, each with its share of its node's cores for torch's threads.
"""

from __future__ import annotations

import os
import re
import time
from typing import Any

import ray
from ray.exceptions import RayActorError, RayTaskError
from ray.util.placement_group import remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from logicrl.controller.cluster import check_cluster, cluster_lost, ensure_ray, join_address
from logicrl.controller.heartbeat import HeartbeatWatch, beating
from logicrl.controller.pending import Pending
from logicrl.controller.placement import place
from logicrl.errors import BadInput

# `pickle.UnpicklingError: ...`, `ValueError: ...`: how a traceback's last line names the exception.
EXCEPTION_LINE = re.compile(r"^[A-Za-z_][\w.]*(Error|Exception|Exit|Interrupt)\b.*:")
WAIT_SLICE_S = 0.2  # how often a wait for the ranks returns to Python (its signal handlers)
# A rank whose peer died often fails first, in the collective they shared (gloo's "Connection reset by
# peer"): this long a wait for another rank's death lets the run name the cause, not the symptom.
DEATH_GRACE_S = 3.0


class WorkerFailed(RuntimeError):
    """A rank's call raised (`cause`), or its process died (`cause` None): which rank, in which phase, why."""

    def __init__(self, rank: int, phase: str, cause: BaseException | None, detail: str, node: str = ""):
        self.rank, self.phase, self.cause, self.node = rank, phase, cause, node
        where = f" on node {node}" if node else ""
        super().__init__(f"rank {rank}{where} {'died' if cause is None else 'failed'} in {phase}: {detail}")


def failure(rank: int, phase: str, err: Exception, node: str = "") -> Exception:
    """What a rank's Ray error means. An exception in a worker's constructor comes back as the
    actor's death carrying the task error, so both shapes are unwrapped."""
    task_error = err if isinstance(err, RayTaskError) else getattr(err, "cause", None)
    if isinstance(task_error, RayTaskError):
        cause = task_error.cause
        if isinstance(cause, BadInput):
            return cause
        first = (str(cause).strip().splitlines() or [""])[0]
        return WorkerFailed(rank, phase, cause, f"{type(cause).__name__}: {first}".rstrip(": "), node)
    if getattr(err, "actor_init_failed", False):
        # Its constructor raised, but Ray kept only the text of the error: its last line is the exception.
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        raised = next((line for line in reversed(lines) if EXCEPTION_LINE.match(line)), lines[-1] if lines else "")
        return WorkerFailed(rank, phase, err, raised[:300], node)
    return WorkerFailed(rank, phase, None, "its process ended without an exception (killed, e.g. by the kernel's "
                                           "OOM killer, or exited; or its node was lost)", node)


def thread_env(threads: int, private: bool) -> dict | None:
    """A rank's runtime_env: OpenMP reads its own variable at start-up (torch's count is the worker's
    argument). None where the worker inherits that value already (a private cluster's workers have
    this driver's environment), so the rank can take a worker the raylet started with; a runtime_env
    of its own would start another (about a CPU second)."""
    if private and os.environ.get("OMP_NUM_THREADS") == str(threads):
        return None
    return {"env_vars": {"OMP_NUM_THREADS": str(threads)}}


class WorkerGroup:
    """`heartbeat_s`: a rank silent for longer ends the wait on it (controller/heartbeat.py); None: no watch."""

    def __init__(self, worker_cls: type, n_ranks: int, use_cuda: bool, nnodes: int = 1,
                 ray_address: str | None = None, heartbeat_s: float | None = None, **init_kwargs: Any):
        ensure_ray(n_ranks, nnodes, use_cuda, ray_address)
        private = join_address(ray_address)[0] is None  # its workers inherit this driver's environment
        placed = place(n_ranks, nnodes, use_cuda, private)
        self.pg, self.nodes = placed.pg, [w.ip for w in placed.where]
        self.master_addr, self.master_port = placed.master_addr, placed.master_port
        self.heartbeats = None
        if heartbeat_s is not None:
            keys = [f"{self.pg.id.hex()}/{rank}" for rank in range(n_ranks)]
            self.heartbeats = HeartbeatWatch(keys, heartbeat_s)
            worker_cls = beating(worker_cls)
        remote_cls = ray.remote(worker_cls)
        self.workers = [
            remote_cls.options(
                num_cpus=1, num_gpus=1 if use_cuda else 0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=rank),
                runtime_env=thread_env(threads, private),
            ).remote(rank=rank, world_size=n_ranks, master_addr=self.master_addr, master_port=self.master_port,
                     threads=threads, **init_kwargs,
                     **({"heartbeat_key": self.heartbeats.keys[rank].decode()} if self.heartbeats else {}))
            for rank, threads in enumerate(placed.threads)
        ]
        # Built now, so a rank that cannot start (its model does not load) is named as such, not
        # as a failure of the first phase called.
        self._gather([w.__ray_ready__.remote() for w in self.workers], "start-up")

    def __len__(self) -> int:
        return len(self.workers)

    def call(self, method: str, *args: Any, **kwargs: Any) -> list:
        """The same call on every rank; returns each rank's result, in rank order."""
        return self.call_async(method, *args, **kwargs).result()

    def dispatch(self, method: str, shards: list, **kwargs: Any) -> list:
        """Rank r gets shards[r]; returns each rank's result, in rank order."""
        return self.dispatch_async(method, shards, **kwargs).result()

    def call_async(self, method: str, *args: Any, **kwargs: Any) -> Pending:
        """`call` without waiting: the handle of the ranks' results."""
        return RayCall(self, [getattr(w, method).remote(*args, **kwargs) for w in self.workers],
                       kwargs.get("phase", method))

    def dispatch_async(self, method: str, shards: list, **kwargs: Any) -> Pending:
        """`dispatch` without waiting: the handle of the ranks' results."""
        assert len(shards) == len(self.workers), f"{len(shards)} shards for {len(self.workers)} ranks"
        return RayCall(self, [getattr(w, method).remote(s, **kwargs) for w, s in zip(self.workers, shards)],
                       kwargs.get("phase", method))

    def _gather(self, futures: list, phase: str) -> list:
        """The ranks' results; the first rank to fail ends the wait at once (the others may be
        blocked in a collective on it, and would wait out its timeout) as a WorkerFailed, or as
        the rank's own BadInput (a bad input only a rank could see)."""
        rank_of = {f: rank for rank, f in enumerate(futures)}
        pending = list(futures)
        while pending:
            # In slices: Python runs a signal handler only when the main thread is back in bytecode,
            # and a stop request repeated while it is blocked in one long wait would arrive as one.
            done, pending = ray.wait(pending, num_returns=1, timeout=WAIT_SLICE_S)
            check_cluster()  # without its GCS the ranks' calls crawl, then Ray kills every process
            if not done:
                self._check_heartbeats(phase)
                continue
            try:
                ray.get(done[0])
            except (RayTaskError, RayActorError) as err:
                check_cluster()  # a rank lost with the GCS: the GCS is the cause to name
                rank = rank_of[done[0]]
                if not isinstance(err, RayActorError):
                    rank, err = died_instead(pending, rank_of, rank, err)
                raise failure(rank, phase, err, self.nodes[rank]) from err
        return ray.get(futures)

    def _check_heartbeats(self, phase: str) -> None:
        silent = self.heartbeats.silent() if self.heartbeats is not None else None
        if silent is not None:
            rank, seconds = silent
            raise WorkerFailed(rank, phase, None, f"it sent no heartbeat for {seconds:.0f} s (trainer.collective_"
                               f"timeout_s={self.heartbeats.bound_s:g}): its process is stopped (kill -STOP, a "
                               "debugger) or stuck outside Python; the run ends and its processes are killed",
                               self.nodes[rank])

    def shutdown(self) -> None:
        # Every call below goes through the GCS: without it each would wait on it for good (the heartbeat keys
        # too, which went with it), leaving the watch thread's grace period to end the run; stop_ray ends them.
        if cluster_lost():
            self.workers = []
            return
        if self.heartbeats is not None:
            self.heartbeats.forget()
        for w in self.workers:
            ray.kill(w)
        remove_placement_group(self.pg)
        self.workers = []


def died_instead(pending: list, rank_of: dict, rank: int, err: Exception) -> tuple[int, Exception]:
    """The first rank among `pending` found dead within DEATH_GRACE_S, with its error; else (rank, err)."""
    deadline = time.monotonic() + DEATH_GRACE_S
    while pending and (left := deadline - time.monotonic()) > 0:
        done, pending = ray.wait(pending, num_returns=1, timeout=min(left, WAIT_SLICE_S))
        for future in done:
            try:
                ray.get(future)
            except RayActorError as died:
                return rank_of[future], died
            except RayTaskError:
                pass
    return rank, err


class RayCall:
    """One call on every rank of a group, issued (a `Pending`): `result()` waits as `WorkerGroup._gather`
    does, the first rank to fail ending the wait."""

    def __init__(self, group: WorkerGroup, futures: list, phase: str):
        self.group, self.futures, self.phase = group, futures, phase

    def ready(self) -> bool:
        _, pending = ray.wait(self.futures, num_returns=len(self.futures), timeout=0)
        return not pending

    def result(self) -> list:
        return self.group._gather(self.futures, self.phase)
