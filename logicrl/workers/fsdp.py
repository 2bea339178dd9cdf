"""FSDP2 plumbing shared by the actor, reference and critic: process group, sharding, optimizer,
and the few collectives the workers run themselves (gathering a DTensor, reducing a number).

FSDP2 (`fully_shard`) shards each decoder layer and then the root, so only one layer's full
parameters exist at a time during forward and backward. On CUDA it runs over NCCL; without CUDA
the same code runs on CPU ranks over gloo (the CI path).

Every helper below that gathers or reduces is a collective: all ranks must call it, in the same
order, or the others wait in it until the process group's timeout.
"""

from __future__ import annotations

import math
import os
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard


def init_distributed(rank: int, world_size: int, master_addr: str, master_port: int,
                     device: torch.device, timeout_s: float = 600.0) -> DeviceMesh:
    """Join the process group (once per process) and return the 1-D data-parallel mesh. A collective
    that waits `timeout_s` (trainer.collective_timeout_s) ends the run, as a hang would not."""
    if not dist.is_initialized():
        os.environ.update(MASTER_ADDR=master_addr, MASTER_PORT=str(master_port))
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=timedelta(seconds=timeout_s))
    if device.type == "cuda":
        torch.cuda.set_device(device)
    return init_device_mesh(device.type, (world_size,))


def _layer_classes(model: torch.nn.Module) -> set[str]:
    """HF names the blocks that must not be split (e.g. Qwen2DecoderLayer): one FSDP unit each."""
    for module in model.modules():
        names = getattr(module, "_no_split_modules", None)
        if names:
            return set(names)
    return set()


def shard_model(model: torch.nn.Module, mesh: DeviceMesh, device: torch.device,
                param_offload: bool = False) -> torch.nn.Module:
    """Shard `model` in place with fully_shard (per decoder layer, then the root) and return it."""
    # Parameter offload only means something with an accelerator: CPU ranks already hold them on CPU.
    offload = CPUOffloadPolicy() if param_offload and device.type == "cuda" else None
    kwargs = {"mesh": mesh, **({"offload_policy": offload} if offload else {})}
    if offload is None:
        model.to(device)
    layers = _layer_classes(model)
    for module in model.modules():
        if type(module).__name__ in layers:
            fully_shard(module, **kwargs)
    fully_shard(model, **kwargs)
    return model


def build_optimizer(model: torch.nn.Module, lr: float, weight_decay: float, total_steps: int,
                    warmup_ratio: float, schedule: str):
    """AdamW over the trainable parameters with linear warm-up, then constant or cosine decay."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, betas=(0.9, 0.999))
    warmup = int(warmup_ratio * total_steps)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / (warmup + 1)
        if schedule == "cosine":
            progress = (step - warmup) / max(1, total_steps - warmup)
            return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
        return 1.0

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def clip_grad_norm(model: torch.nn.Module, max_norm: float) -> float:
    """Clip the global gradient norm (over all shards) and return it, taken before clipping."""
    params = [p for p in model.parameters() if p.grad is not None]
    norm = torch.nn.utils.clip_grad_norm_(params, max_norm)
    return float(full_tensor(norm))


def drop_unreduced_grads(model: torch.nn.Module) -> None:
    """Forget gradients accumulated under set_requires_gradient_sync(False) and not yet reduced.

    optimizer.zero_grad() clears the sharded .grad only; FSDP2 keeps the unreduced micro-batch
    gradients on its unsharded parameters until the next synced backward reduce-scatters them.
    An OOM retry (workers/oom.py) must drop those too, or the failed attempt's micro-batches
    would count twice. FSDP2 has no public call for this, so this reaches into its parameter
    groups; tests/workers/test_micro_oom.py fails if a torch upgrade moves them.
    """
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if not isinstance(module, FSDPModule):
            continue
        for group in module._get_fsdp_state()._fsdp_param_groups:
            for fsdp_param in group.fsdp_params:
                fsdp_param.unsharded_accumulated_grad = None
                unsharded = getattr(fsdp_param, "_unsharded_param", None)
                if unsharded is not None:
                    unsharded.grad = None
    for p in model.parameters():
        p.grad = None


def full_tensor(t: torch.Tensor) -> torch.Tensor:
    """The whole tensor: a DTensor (an FSDP2 shard) is all-gathered, a plain tensor comes back as is."""
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def _multi_rank() -> bool:
    return dist.is_initialized() and dist.get_world_size() > 1


def all_reduce_sum(value: float | int, device: torch.device) -> float:
    """Sum a number over ranks (e.g. a mini-batch's valid tokens, for the loss normaliser)."""
    t = torch.tensor(float(value), dtype=torch.float64, device=device)
    if _multi_rank():
        dist.all_reduce(t)
    return float(t)


def all_reduce_max(value: int, device: torch.device) -> int:
    """The largest integer over ranks: a count every rank must agree on (micro-batches, since each
    runs FSDP2's collectives), or a 0/1 flag raised on any rank (an OOM). One rank: `value` itself,
    with no device round trip."""
    if not _multi_rank():
        return value
    t = torch.tensor(value, device=device)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    return int(t)


def iter_full_params(model: torch.nn.Module):
    """(name, full tensor) one parameter at a time: all-gathers a shard, never the whole state dict."""
    for name, param in model.named_parameters():
        yield name, full_tensor(param).detach()
