"""Where the ranks run: one bundle per rank, spread `n_gpus_per_node` to a node; the rendezvous
address and port chosen on rank 0's own node; each rank's threads from its own node's CPUs.

The address and the threads are found by a probe task run inside each rank's bundle, before the
ranks start (their constructors block in the process group's rendezvous, so they cannot be asked).
Taking the driver's IP instead is wrong as soon as rank 0 lands on another node, and a loopback
simulation of two nodes cannot see it (every 127/8 address reaches the same kernel), so the
choice is a pure function of what the probes saw, tested on its own. A private cluster is the
driver's own node, whose workers inherit its CPU affinity: the driver looks itself, and no worker
process starts for the probe.
"""

from __future__ import annotations

import ipaddress
import os
from collections import Counter
from dataclasses import dataclass

import ray
from ray.exceptions import GetTimeoutError
from ray.util.placement_group import PlacementGroup, placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from logicrl.controller.cluster import resources, roomy_nodes
from logicrl.controller.ports import free_port
from logicrl.errors import BadInput

# How long the ranks' bundles may wait for room. A cluster too small is refused before this (the
# resources are compared first); this bounds the rest: room held by another job.
PLACEMENT_TIMEOUT_S = 120
# A bundle asks this much of a node's `node:<ip>` resource (each node has 1.0 of its own) to be
# pinned to that node.
PIN = 0.001


@dataclass(frozen=True)
class Where:
    """What a probe in one rank's bundle saw."""

    node_id: str
    ip: str
    cpus: int  # cores this process may run on (its affinity: a SLURM step's cgroup, taskset)
    port: int | None  # a free port on that node; asked of rank 0's probe only


@dataclass
class Placement:
    pg: PlacementGroup
    where: list[Where]  # by rank
    master_addr: str
    master_port: int
    threads: list[int]  # by rank


def seen_here(want_port: bool) -> Where:
    """What a probe sees from the process it runs in."""
    ip = ray.util.get_node_ip_address()
    return Where(ray.get_runtime_context().get_node_id(), ip, len(os.sched_getaffinity(0)),
                 free_port(ip) if want_port else None)


_probe = ray.remote(num_cpus=0)(seen_here)


def pick_nodes(nodes: list[dict], nnodes: int, driver_ip: str) -> list[str]:
    """The IPs of the `nnodes` nodes to use, from the roomy ones: the driver's first (rank 0 beside
    the driver), then by address, so the same cluster gives the same placement."""
    ips = sorted({n["NodeManagerAddress"] for n in nodes}, key=lambda ip: (ip != driver_ip, ipaddress.ip_address(ip)))
    return ips[:nnodes]


def bundles(n_ranks: int, use_cuda: bool, node_ips: list[str] | None) -> list[dict]:
    """One bundle per rank; with node IPs, rank r on node r // (n_ranks / nodes)."""
    one = {"CPU": 1, **({"GPU": 1} if use_cuda else {})}
    if not node_ips:
        return [dict(one) for _ in range(n_ranks)]
    per_node = n_ranks // len(node_ips)
    return [{**one, f"node:{ip}": PIN} for ip in node_ips for _ in range(per_node)]


def rendezvous(where: list[Where]) -> tuple[str, int]:
    """Rank 0's node's address and the port its probe found free there."""
    assert where[0].port is not None, "rank 0's probe is asked for a port"
    return where[0].ip, where[0].port


def threads_per_rank(where: list[Where], node_cpus: dict[str, float], cap: int | None = None) -> list[int]:
    """Each rank's share of its own node: the node's CPUs in Ray (what SLURM gave it, or this
    machine's for a private cluster), bounded by the cores the process may run on, split among
    the ranks on that node, and by `cap` (thread_cap()). GPU ranks too: with param_offload their
    AdamW step runs on the host (CPUOffloadPolicy), where one thread would take seconds per step at 7B."""
    on_node = Counter(w.node_id for w in where)
    share = [max(1, min(int(node_cpus.get(w.node_id, w.cpus)), w.cpus) // on_node[w.node_id]) for w in where]
    return [min(n, cap) for n in share] if cap else share


def thread_cap() -> int | None:
    """OMP_NUM_THREADS where the user set it: torch.set_num_threads would otherwise override it. Runs
    that share a machine need it (a sweep's jobs on one node, make test's two at a time): each rank
    taking every core makes OpenMP's idle threads spin on cores the other runs need."""
    value = os.environ.get("OMP_NUM_THREADS", "")
    return int(value) if value.isdigit() and int(value) > 0 else None


def place(n_ranks: int, nnodes: int, use_cuda: bool, private: bool = False) -> Placement:
    """Reserve the ranks' bundles and probe them (the cluster is up: controller/cluster.py); `private`:
    the cluster this driver started, on its own node."""
    node_ips = None
    if nnodes > 1:
        node_ips = pick_nodes(roomy_nodes(n_ranks // nnodes, use_cuda), nnodes, ray.util.get_node_ip_address())
    pg = placement_group(bundles(n_ranks, use_cuda, node_ips), strategy="PACK")
    try:
        ray.get(pg.ready(), timeout=PLACEMENT_TIMEOUT_S)
    except GetTimeoutError:
        remove_placement_group(pg)
        one = bundles(1, use_cuda, None)[0]
        raise BadInput(f"{n_ranks} rank(s) of {resources(one)} each found no room in {PLACEMENT_TIMEOUT_S} s; "
                       f"the cluster has {resources(ray.available_resources())} free of "
                       f"{resources(ray.cluster_resources())}: lower trainer.n_gpus or free the cluster") from None
    if private:
        where = [seen_here(rank == 0) for rank in range(n_ranks)]
    else:
        where = ray.get([_probe.options(scheduling_strategy=PlacementGroupSchedulingStrategy(
            pg, placement_group_bundle_index=rank)).remote(rank == 0) for rank in range(n_ranks)])
    node_cpus = {n["NodeID"]: n["Resources"].get("CPU", 0) for n in ray.nodes() if n["Alive"]}
    return Placement(pg, where, *rendezvous(where), threads_per_rank(where, node_cpus, thread_cap()))
