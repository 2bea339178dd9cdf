"""Run as a script (its own process: Ray's auth mode is read once at import): a Ray cluster of three
"nodes" on loopback addresses, a WorkerGroup of 2 ranks with trainer.nnodes=2 on it, and what each
rank saw, printed as JSON. With `lose-node`, rank 1's node is removed (its raylet and workers
killed, no grace) while both ranks are inside a long call, and what the driver saw is printed.

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
            seen["lost"] = lose_node(cluster, last, group)
        print("PROBE", json.dumps(seen), flush=True)  # a node's dying logs may follow it on stdout
        if mode != "lose-node":
            group.shutdown()
    finally:
        stop_ray()
        cluster.shutdown()


if __name__ == "__main__":
    main(*sys.argv[1:])
