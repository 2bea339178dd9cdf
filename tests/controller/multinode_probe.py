"""Run as a script (its own process: Ray's auth mode is read once at import): a Ray cluster of three
"nodes" on loopback addresses, a WorkerGroup of 2 ranks with trainer.nnodes=2 on it, and what each
rank saw, printed as JSON.

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


def main(temp_dir: str) -> None:
    import ray
    from ray.cluster_utils import Cluster

    from logicrl.controller.cluster import stop_ray
    from logicrl.controller.worker_group import WorkerGroup

    common = dict(temp_dir=temp_dir, include_dashboard=False, object_store_memory=80 * 2**20)
    cluster = Cluster(initialize_head=True, head_node_args=dict(node_ip_address="127.0.0.2", num_cpus=0, **common))
    try:
        cluster.add_node(node_ip_address="127.0.0.3", num_cpus=2, object_store_memory=80 * 2**20)
        cluster.add_node(node_ip_address="127.0.0.4", num_cpus=1, object_store_memory=80 * 2**20)
        group = WorkerGroup(Probe, 2, use_cuda=False, nnodes=2, ray_address=cluster.address)
        print(json.dumps({"driver": ray.util.get_node_ip_address(), "ranks": group.call("report")}))
        group.shutdown()
    finally:
        stop_ray()
        cluster.shutdown()


if __name__ == "__main__":
    main(sys.argv[1])
