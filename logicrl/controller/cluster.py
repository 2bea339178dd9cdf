"""The Ray cluster a run uses: its own private one, or one it was told to join.

Without `trainer.ray_address` (or RAY_ADDRESS) every run starts a private local cluster, whatever
else runs on the machine: `ray.init()` with no address would join the last cluster `ray start`
left in /tmp/ray (anyone's, e.g. another job's on a shared node) and then refuse the resources
asked of it. Joining is explicit: the SLURM wrapper (slurm/train.sbatch) passes its own job's head.
Token auth follows the environment (RAY_AUTH_MODE, RAY_AUTH_TOKEN_PATH), which Ray reads itself;
a cluster that refuses the driver is named with those two variables.
"""

from __future__ import annotations

import os
import socket
import time

import ray

from logicrl.errors import BadInput
from logicrl.signals import stop_on_signals

# How long a joined cluster may take to show the nodes a run asks for: a SLURM job's workers
# join the head some seconds after it starts.
NODES_TIMEOUT_S = 120


def join_address(configured: str | None) -> tuple[str | None, str]:
    """The cluster to join and the key that named it: trainer.ray_address, else RAY_ADDRESS, else
    None (start a private one)."""
    if configured:
        return configured, "trainer.ray_address"
    return os.environ.get("RAY_ADDRESS") or None, "RAY_ADDRESS"


def ensure_ray(n_ranks: int, nnodes: int, use_cuda: bool, ray_address: str | None = None) -> None:
    """Start a private cluster with room for `n_ranks` ranks, or join the one named by
    `ray_address` or RAY_ADDRESS and check that it has `nnodes` nodes with room for them."""
    if ray.is_initialized():
        return
    address, key = join_address(ray_address)
    if address:
        reachable(address, key)
        try:
            ray.init(address=address, log_to_driver=True)
        except (ConnectionError, RuntimeError, ValueError) as err:
            raise BadInput(f"{key}={address}: cannot join that Ray cluster "
                           f"({' '.join(str(err).split())[:160]}): if it uses token auth, set RAY_AUTH_MODE=token "
                           "and RAY_AUTH_TOKEN_PATH as on its nodes; or leave trainer.ray_address and RAY_ADDRESS "
                           "unset to start a private one here") from None
    else:
        # address="local": a new cluster even when one is running here. At least one CPU per rank
        # even on a 2-core machine: ranks mostly wait on each other, and each rank's thread count
        # is set explicitly (controller/placement.py).
        ray.init(address="local", num_cpus=max(os.cpu_count() or 1, n_ranks), include_dashboard=False,
                 log_to_driver=True, runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "false"}})
    stop_on_signals()  # ray.init installed its own handler: take the signals back (logicrl/signals.py)
    check_room(n_ranks, use_cuda)
    if nnodes > 1:
        wait_for_nodes(nnodes, n_ranks // nnodes, use_cuda)


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
            raise BadInput(f"trainer.nnodes={nnodes} needs {nnodes} Ray nodes with {resources(need(per_node, use_cuda))}"
                           f" each; after {NODES_TIMEOUT_S} s the cluster has {len(found)} such of "
                           f"{sum(n['Alive'] for n in ray.nodes())} alive: lower trainer.nnodes or start more nodes")
        time.sleep(1)


def resources(r: dict) -> str:
    return ", ".join(f"{v:g} {k}" for k, v in r.items())
