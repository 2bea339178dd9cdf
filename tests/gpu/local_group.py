"""The worker group's interface over one in-process rank: the step loop without Ray.

The lent GPU machines have torch and transformers but no Ray, and Ray's wheel is larger than what
can be carried there, so the GPU tier drives logicrl's real trainer (trainer/ppo.py, which takes
the group class as an argument) with this one-rank stand-in for controller/worker_group.py. It
keeps that group's contract: `call` and `dispatch` return one result per rank in rank order, and
a rank's exception propagates.
"""

from __future__ import annotations

import sys
from typing import Any

from logicrl.controller.ports import free_port


class LocalGroup:
    def __init__(self, worker_cls: type, n_ranks: int, use_cuda: bool, nnodes: int = 1,
                 ray_address: str | None = None, **init_kwargs: Any):
        if n_ranks != 1 or nnodes != 1:
            raise ValueError(f"LocalGroup runs one rank in this process, not {n_ranks} on {nnodes} node(s)")
        self.nodes = ["127.0.0.1"]
        # A Ray worker sends its stdout and stderr to the run's log file (logs.quiet_worker); here
        # that would be the test process's own, so they stay where pytest captures them.
        init_kwargs["log_file"] = None
        self.workers = [worker_cls(rank=0, world_size=1, master_addr="127.0.0.1", master_port=free_port("127.0.0.1"),
                                   **init_kwargs)]

    def __len__(self) -> int:
        return len(self.workers)

    def call(self, method: str, *args: Any, **kwargs: Any) -> list:
        return [getattr(w, method)(*args, **kwargs) for w in self.workers]

    def dispatch(self, method: str, shards: list, **kwargs: Any) -> list:
        assert len(shards) == len(self.workers), f"{len(shards)} shards for {len(self.workers)} ranks"
        return [getattr(w, method)(s, **kwargs) for w, s in zip(self.workers, shards)]

    def shutdown(self) -> None:
        import torch.distributed as dist

        self.workers = []
        # A vLLM engine's own exit handler tears down the groups it cut from this one, then the
        # world: destroying it first makes that handler fail ("Invalid process group specified").
        if dist.is_initialized() and "vllm" not in sys.modules:
            dist.destroy_process_group()
