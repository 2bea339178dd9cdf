"""Spawned ranks that start in a fraction of a second: torch.multiprocessing's ranks forked from a
forkserver that has imported torch, tensordict, transformers and the worker modules once per test
process. A spawned rank imports them itself, about 5 CPU s (10-30 s on loaded cores) for work that
takes a second. The server is a fresh process of its own, so nothing of the test process (a process
group, OpenMP's threads) reaches a rank, as with spawn; only the environment is the server's, taken when
it started: pass what a rank needs as arguments, never through os.environ. Shared by the tests that
start gloo ranks (tests/workers, tests/models/test_ulysses.py); `spawn` is `torch.multiprocessing.spawn`.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable

import torch.multiprocessing as mp

# What every rank imports before its work (a module that fails to import here is imported by the rank).
PRELOAD = ["pytest", "torch.distributed.checkpoint", "torch.distributed.fsdp", "tensordict",
           "transformers.models.qwen2.modeling_qwen2", "tests.workers.conftest", "tests.helpers.actor_ranks",
           "logicrl.workers.actor", "logicrl.workers.update", "logicrl.workers.fsdp", "logicrl.workers.checkpoint"]


def spawn(fn: Callable, args: tuple = (), nprocs: int = 1) -> None:
    """fn(rank, *args) in `nprocs` processes; raises as torch.multiprocessing.spawn does when one fails."""
    multiprocessing.get_context("forkserver").set_forkserver_preload(PRELOAD)  # read when the server starts
    mp.start_processes(fn, args=args, nprocs=nprocs, join=True, start_method="forkserver")
