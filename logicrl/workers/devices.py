"""Which device a worker rank trains on: the CPU, or its GPU among those visible to it (under Ray or not)."""

from __future__ import annotations

import os
import sys

import torch


def pick_device(kind: str, rank: int) -> torch.device:
    cuda = torch.cuda.is_available()
    if kind == "cuda" and not cuda:
        raise RuntimeError("trainer.device=cuda but CUDA is not available here: use trainer.device=auto or cpu")
    if kind == "cpu" or not cuda:
        return torch.device("cpu")
    # A Ray worker always has ray imported; anything else (tests, one process) does not need it.
    ray = sys.modules.get("ray")
    ray_ids = ray.get_gpu_ids() if ray is not None and ray.is_initialized() else []
    return torch.device("cuda", gpu_index(rank, torch.cuda.device_count(), ray_ids,
                                          os.environ.get("CUDA_VISIBLE_DEVICES")))


def gpu_index(rank: int, count: int, ray_ids: list, visible: str | None) -> int:
    """This rank's index among the visible GPUs.

    Under Ray it is the GPU Ray assigned (ray.get_gpu_ids(), named as in CUDA_VISIBLE_DEVICES).
    Ray usually narrows CUDA_VISIBLE_DEVICES to that GPU, which makes it index 0; with
    RAY_EXPERIMENTAL_NOSET_CUDA_VISIBLE_DEVICES every rank sees all of them, and taking index 0
    would put every rank on GPU 0 (NCCL: "Duplicate GPU detected"). Without Ray: the one visible
    GPU, or one per rank.
    """
    if ray_ids:
        gpu = str(ray_ids[0])
        if visible is None:
            return int(gpu)  # every GPU visible, in the driver's order
        names = [name.strip() for name in visible.split(",")]
        if gpu not in names:
            raise RuntimeError(f"Ray assigned GPU {gpu} to rank {rank} but CUDA_VISIBLE_DEVICES={visible} hides it: "
                               "leave CUDA_VISIBLE_DEVICES to Ray")
        return names.index(gpu)
    return 0 if count == 1 else rank % count
