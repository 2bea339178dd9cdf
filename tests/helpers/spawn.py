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
import multiprocessing.forkserver
import os
from collections.abc import Callable

import torch.multiprocessing as mp

# What every rank imports before its work (a module that fails to import here is imported by the rank).
PRELOAD = ["pytest", "torch.distributed.checkpoint", "torch.distributed.fsdp", "tensordict",
           "transformers.models.qwen2.modeling_qwen2", "tests.workers.conftest", "tests.helpers.actor_ranks",
           "logicrl.workers.actor", "logicrl.workers.update", "logicrl.workers.fsdp", "logicrl.workers.checkpoint"]


def _forget_a_reaped_server() -> None:
    """A test that ends its process's descendants (an in-process Ray cluster's stop_ray) ends the server too and
    reaps it; multiprocessing then raises ChildProcessError at the next start instead of starting a new server."""
    server = multiprocessing.forkserver._forkserver
    if server._forkserver_pid is None:
        return
    try:
        if os.waitpid(server._forkserver_pid, os.WNOHANG)[0] == 0:
            return  # alive
    except ChildProcessError:
        pass  # reaped by someone else
    os.close(server._forkserver_alive_fd)
    server._forkserver_pid = server._forkserver_address = server._forkserver_alive_fd = None


def spawn(fn: Callable, args: tuple = (), nprocs: int = 1) -> None:
    """fn(rank, *args) in `nprocs` processes; raises as torch.multiprocessing.spawn does when one fails."""
    _forget_a_reaped_server()
    multiprocessing.get_context("forkserver").set_forkserver_preload(PRELOAD)  # read when the server starts
    mp.start_processes(fn, args=args, nprocs=nprocs, join=True, start_method="forkserver")
