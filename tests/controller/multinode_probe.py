"""Run as a script (its own process: Ray's auth mode is read once at import): a Ray cluster of three
"nodes" on loopback addresses, a WorkerGroup of 2 ranks with trainer.nnodes=2 on it, and what each
rank saw, printed as JSON. With `lose-node`, rank 1's node is removed (its raylet and workers
killed, no grace) while both ranks are inside a long call, and what the driver saw is printed; before
that, a fourth node joins and one-step-off's two groups of one rank each land on the two free CPUs (two
nodes) and broadcast a tensor over the weight group that meets at the trainer rank's node.

The head (the driver's node, 127.0.0.2) has no CPUs, so no rank can run beside the driver: rank 0
lands on another node, where a rendezvous taken from the driver would point at the wrong host.
"""

from __future__ import annotations

import json
import os
import sys


class Probe:
    def __init__(self, rank, world_size, master_addr, master_port, threads):
        import ray

        self.seen = dict(rank=rank, node=ray.util.get_node_ip_address(), master_addr=master_addr,
                         master_port=master_port, threads=threads, omp=os.environ.get("OMP_NUM_THREADS"))

    def report(self):
        return self.seen

    def hold(self, seconds: float):
        import time

        time.sleep(seconds)
        return self.seen["node"]


class GroupProbe:
    """A one-rank group of one-step-off's two (trainer, rollout): where it sits and what a weight broadcast
    between the groups carries (workers/collective.py's WeightGroup, at the trainer rank's node)."""

    def __init__(self, rank, world_size, master_addr, master_port, threads):
        import ray

        self.node, self.master_addr = ray.util.get_node_ip_address(), master_addr

    def weight_group_address(self):
        import socket

        with socket.socket() as s:  # as trainer_worker.py: a free port on this rank's node
            s.bind((self.master_addr, 0))
            return self.master_addr, s.getsockname()[1]

    def broadcast(self, addr, port, rank):
        import torch

        from logicrl.workers.collective import WeightGroup

        group = WeightGroup.join(addr, port, rank, 2, torch.device("cpu"), 60)
        tensor = torch.arange(6, dtype=torch.float32) if rank == 0 else torch.zeros(6)
        group.broadcast(tensor, "update_weights", "a probe tensor")
        return dict(node=self.node, got=tensor.tolist())


def two_groups(cluster) -> dict:
    """A trainer group and a rollout group of one rank each, on nodes of their own, and a broadcast between."""
    from logicrl.controller.pending import gather
    from logicrl.controller.worker_group import WorkerGroup

    cluster.add_node(node_ip_address="127.0.0.5", num_cpus=1, object_store_memory=80 * 2**20)
    trainer = WorkerGroup(GroupProbe, 1, use_cuda=False, nnodes=1, ray_address=cluster.address)
    rollout = WorkerGroup(GroupProbe, 1, use_cuda=False, nnodes=1, ray_address=cluster.address)
    addr, port = trainer.call("weight_group_address")[0]
    sent, received = gather(trainer.call_async("broadcast", addr, port, 0),
                            rollout.call_async("broadcast", addr, port, 1))
    trainer.shutdown(), rollout.shutdown()
    return dict(address=addr, trainer=sent[0], rollout=received[0])


def lose_node(cluster, node, group) -> dict:
    """Removes `node` two seconds into a 300 s call on every rank: how long the call took to end, and how."""
    import threading
    import time

    from logicrl.controller.worker_group import WorkerFailed

    threading.Timer(2.0, cluster.remove_node, args=(node,), kwargs=dict(allow_graceful=False)).start()
    start = time.monotonic()
    try:
        group.call("hold", 300)
        return dict(seconds=time.monotonic() - start, error=None)
    except WorkerFailed as err:
        return dict(seconds=time.monotonic() - start, error=str(err), rank=err.rank, node=err.node)


def main(temp_dir: str, mode: str = "report") -> None:
    import ray
    from ray.cluster_utils import Cluster

    from logicrl.controller.cluster import stop_ray
    from logicrl.controller.worker_group import WorkerGroup

    common = dict(temp_dir=temp_dir, include_dashboard=False, object_store_memory=80 * 2**20)
    cluster = Cluster(initialize_head=True, head_node_args=dict(node_ip_address="127.0.0.2", num_cpus=0, **common))
    try:
        cluster.add_node(node_ip_address="127.0.0.3", num_cpus=2, object_store_memory=80 * 2**20)
        last = cluster.add_node(node_ip_address="127.0.0.4", num_cpus=1, object_store_memory=80 * 2**20)
        group = WorkerGroup(Probe, 2, use_cuda=False, nnodes=2, ray_address=cluster.address)
        seen = {"driver": ray.util.get_node_ip_address(), "ranks": group.call("report")}
        if mode == "lose-node":
            seen["two_groups"] = two_groups(cluster)
        if mode == "lose-node":
            seen["lost"] = lose_node(cluster, last, group)
        print("PROBE", json.dumps(seen), flush=True)  # a node's dying logs may follow it on stdout
        if mode != "lose-node":
            group.shutdown()
    finally:
        stop_ray()
        cluster.shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:])
