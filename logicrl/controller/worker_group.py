"""One Ray actor per rank, placed with a placement group, called together.

The workers are plain classes (tests build them directly); this module only places them and
fans calls out: `call` sends the same arguments to every rank, `dispatch` sends rank r its own
shard. On a machine without CUDA the ranks are CPU processes over gloo, each with an equal share
of the cores for torch's threads.
"""

from __future__ import annotations

import os
import socket
from typing import Any

import ray
from ray.exceptions import GetTimeoutError, RayActorError, RayTaskError
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from logicrl.errors import BadInput
from logicrl.signals import stop_on_sigterm

# How long the ranks' bundles may wait for room. A cluster too small is refused before this (the
# resources are compared first); this bounds the rest: nodes that are still joining, or room
# held by another job.
PLACEMENT_TIMEOUT_S = 120


class WorkerFailed(RuntimeError):
    """A rank's call raised (`cause`), or its process died (`cause` None): which rank, in which phase, why."""

    def __init__(self, rank: int, phase: str, cause: BaseException | None, detail: str):
        self.rank, self.phase, self.cause = rank, phase, cause
        super().__init__(f"rank {rank} {'died' if cause is None else 'failed'} in {phase}: {detail}")


def failure(rank: int, phase: str, err: Exception) -> Exception:
    """What a rank's Ray error means. An exception in a worker's constructor comes back as the
    actor's death carrying the task error, so both shapes are unwrapped."""
    task_error = err if isinstance(err, RayTaskError) else getattr(err, "cause", None)
    if isinstance(task_error, RayTaskError):
        cause = task_error.cause
        if isinstance(cause, BadInput):
            return cause
        first = (str(cause).strip().splitlines() or [""])[0]
        return WorkerFailed(rank, phase, cause, f"{type(cause).__name__}: {first}".rstrip(": "))
    return WorkerFailed(rank, phase, None, "its process ended without an exception (killed, e.g. by the kernel's "
                                           "OOM killer, or exited)")


def ensure_ray(n_ranks: int, use_cuda: bool) -> None:
    """Start (or join, under RAY_ADDRESS / SLURM) a Ray cluster with room for `n_ranks` ranks."""
    if ray.is_initialized():
        return
    address = os.environ.get("RAY_ADDRESS")
    if address:
        reachable(address)
        try:
            ray.init(address=address, log_to_driver=True)
        except (ConnectionError, RuntimeError, ValueError) as err:
            raise BadInput(f"RAY_ADDRESS={address}: cannot join that Ray cluster ({' '.join(str(err).split())[:160]}): "
                           "if it uses token auth, set RAY_AUTH_MODE=token and RAY_AUTH_TOKEN_PATH as on its nodes; "
                           "or unset RAY_ADDRESS to start one here") from None
    else:
        # Locally, claim at least one CPU per rank even on a 2-core machine: ranks mostly wait on
        # each other, and the thread count per rank is set explicitly below.
        ray.init(num_cpus=max(os.cpu_count() or 1, n_ranks), include_dashboard=False, log_to_driver=True,
                 runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "false"}})
    stop_on_sigterm()  # ray.init installed its own handler: take SIGTERM back (logicrl/signals.py)

    check_room(n_ranks, use_cuda)


def stop_ray() -> None:
    """ray.shutdown, then end what is left of the processes this driver started: its descendants
    (the GCS, the raylet, the workers), found before the raylet dies and orphans the workers;
    never by name, so other clusters on the machine are left alone, as is a joined cluster."""
    import psutil

    mine = psutil.Process().children(recursive=True)
    if ray.is_initialized():
        ray.shutdown()
    _, alive = psutil.wait_procs(mine, timeout=5)
    for proc in alive:
        try:
            proc.kill()
        except psutil.NoSuchProcess:
            pass
    psutil.wait_procs(alive, timeout=5)


def reachable(address: str, timeout_s: float = 5.0) -> None:
    """A host:port RAY_ADDRESS that answers, or a BadInput in seconds: ray.init would retry an
    unreachable one for minutes. Other forms ("auto", ray://) are left to Ray."""
    host, _, port = address.rpartition(":")
    if not host or not port.isdigit() or "://" in address:
        return
    try:
        socket.create_connection((host, int(port)), timeout=timeout_s).close()
    except OSError as err:
        raise BadInput(f"RAY_ADDRESS={address}: no Ray cluster answers there ({err.strerror or err}): start it "
                       "(ray start --head) or unset RAY_ADDRESS to start one here") from None


def check_room(n_ranks: int, use_cuda: bool) -> None:
    """Refuse a cluster that can never hold the ranks, before anything waits on it."""
    need = {"CPU": n_ranks, **({"GPU": n_ranks} if use_cuda else {})}
    have = ray.cluster_resources()
    short = {k: v for k, v in need.items() if have.get(k, 0) < v}
    if short:
        raise BadInput(f"trainer.n_gpus={n_ranks} needs {_resources(need)} but the Ray cluster has "
                       f"{_resources({k: have.get(k, 0) for k in need})}: lower trainer.n_gpus or add nodes")


def _resources(r: dict) -> str:
    return ", ".join(f"{v:g} {k}" for k, v in r.items())


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


class WorkerGroup:
    def __init__(self, worker_cls: type, n_ranks: int, use_cuda: bool, **init_kwargs: Any):
        ensure_ray(n_ranks, use_cuda)
        bundle = {"CPU": 1, "GPU": 1} if use_cuda else {"CPU": 1}
        self.pg = placement_group([bundle] * n_ranks, strategy="PACK")
        try:
            ray.get(self.pg.ready(), timeout=PLACEMENT_TIMEOUT_S)
        except GetTimeoutError:
            remove_placement_group(self.pg)
            raise BadInput(f"{n_ranks} rank(s) of {_resources(bundle)} each found no room in {PLACEMENT_TIMEOUT_S} s; "
                           f"the cluster has {_resources(ray.available_resources())} free of "
                           f"{_resources(ray.cluster_resources())}: lower trainer.n_gpus or free the cluster") from None
        threads = 1 if use_cuda else max(1, (os.cpu_count() or 1) // n_ranks)
        remote_cls = ray.remote(worker_cls)
        self.master_addr = ray.util.get_node_ip_address()
        self.master_port = free_port()
        self.workers = [
            remote_cls.options(
                num_cpus=1, num_gpus=1 if use_cuda else 0,
                scheduling_strategy=PlacementGroupSchedulingStrategy(self.pg, placement_group_bundle_index=rank),
                # OpenMP reads its own variable at start-up; torch's count is the worker's argument.
                runtime_env={"env_vars": {"OMP_NUM_THREADS": str(threads)}},
            ).remote(rank=rank, world_size=n_ranks, master_addr=self.master_addr, master_port=self.master_port,
                     threads=threads, **init_kwargs)
            for rank in range(n_ranks)
        ]
        # Built now, so a rank that cannot start (its model does not load) is named as such, not
        # as a failure of the first phase called.
        self._gather([w.__ray_ready__.remote() for w in self.workers], "start-up")

    def __len__(self) -> int:
        return len(self.workers)

    def call(self, method: str, *args: Any, **kwargs: Any) -> list:
        """The same call on every rank; returns each rank's result, in rank order."""
        return self._gather([getattr(w, method).remote(*args, **kwargs) for w in self.workers],
                            kwargs.get("phase", method))

    def dispatch(self, method: str, shards: list, **kwargs: Any) -> list:
        """Rank r gets shards[r]; returns each rank's result, in rank order."""
        assert len(shards) == len(self.workers), f"{len(shards)} shards for {len(self.workers)} ranks"
        return self._gather([getattr(w, method).remote(s, **kwargs) for w, s in zip(self.workers, shards)],
                            kwargs.get("phase", method))

    def _gather(self, futures: list, phase: str) -> list:
        """The ranks' results; the first rank to fail ends the wait at once (the others may be
        blocked in a collective on it, and would wait out its timeout) as a WorkerFailed, or as
        the rank's own BadInput (a bad input only a rank could see)."""
        rank_of = {f: rank for rank, f in enumerate(futures)}
        pending = list(futures)
        while pending:
            done, pending = ray.wait(pending, num_returns=1)
            try:
                ray.get(done[0])
            except (RayTaskError, RayActorError) as err:
                raise failure(rank_of[done[0]], phase, err) from err
        return ray.get(futures)

    def shutdown(self) -> None:
        for w in self.workers:
            ray.kill(w)
        remove_placement_group(self.pg)
        self.workers = []
