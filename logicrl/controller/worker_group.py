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
from ray.util.placement_group import placement_group, remove_placement_group
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy


def ensure_ray(n_ranks: int, use_cuda: bool) -> None:
    """Start (or join, under RAY_ADDRESS / SLURM) a Ray cluster with room for `n_ranks` ranks."""
    if ray.is_initialized():
        return
    address = os.environ.get("RAY_ADDRESS")
    if address:
        ray.init(address=address, log_to_driver=True)
        return
    # Locally, claim at least one CPU per rank even on a 2-core machine: ranks mostly wait on
    # each other, and the thread count per rank is set explicitly below.
    ray.init(num_cpus=max(os.cpu_count() or 1, n_ranks), include_dashboard=False, log_to_driver=True,
             runtime_env={"env_vars": {"TOKENIZERS_PARALLELISM": "false"}})


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


class WorkerGroup:
    def __init__(self, worker_cls: type, n_ranks: int, use_cuda: bool, **init_kwargs: Any):
        ensure_ray(n_ranks, use_cuda)
        bundle = {"CPU": 1, "GPU": 1} if use_cuda else {"CPU": 1}
        self.pg = placement_group([bundle] * n_ranks, strategy="PACK")
        ray.get(self.pg.ready())
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

    def __len__(self) -> int:
        return len(self.workers)

    def call(self, method: str, *args: Any, **kwargs: Any) -> list:
        """The same call on every rank; returns each rank's result, in rank order."""
        return ray.get([getattr(w, method).remote(*args, **kwargs) for w in self.workers])

    def dispatch(self, method: str, shards: list, **kwargs: Any) -> list:
        """Rank r gets shards[r]; returns each rank's result, in rank order."""
        assert len(shards) == len(self.workers), f"{len(shards)} shards for {len(self.workers)} ranks"
        return ray.get([getattr(w, method).remote(s, **kwargs) for w, s in zip(self.workers, shards)])

    def shutdown(self) -> None:
        for w in self.workers:
            ray.kill(w)
        remove_placement_group(self.pg)
        self.workers = []
