"""FSDP2 plumbing shared by the actor, reference and critic: process group, sharding, optimizer,
and the few collectives the workers run themselves (gathering a DTensor, reducing a number).

FSDP2 (`fully_shard`) shards each decoder layer and then the root, so only one layer's full
parameters exist at a time during forward and backward. On CUDA it runs over NCCL, with gloo beside
it for CPU tensors; without CUDA the same code runs on CPU ranks over gloo (the CI path).

Offload, as verl means it: `param_offload` keeps the shards (and their gradients) on the host
through FSDP2's CPUOffloadPolicy, so every gather below first moves a host shard to the rank's
device and gathers there, over NCCL (verl fsdp_workers.py, TRL vllm_generation.py do the same);
`optimizer_offload` keeps AdamW's states on the host between updates (offload_optimizer /
load_optimizer, verl's fsdp_utils offload_fsdp_optimizer / load_fsdp_optimizer).

Every helper below that gathers or reduces is a collective: all ranks must call it, in the same
order, or the others wait in it until the process group's timeout.
"""

from __future__ import annotations

import ipaddress
import math
import os
import socket
from datetime import timedelta

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard


def init_distributed(rank: int, world_size: int, master_addr: str, master_port: int,
                     device: torch.device, timeout_s: float = 600.0) -> DeviceMesh:
    """Join the process group (once per process) and return the 1-D data-parallel mesh. A collective
    that waits `timeout_s` (trainer.collective_timeout_s) ends the run, as a hang would not.

    On CUDA the group has two backends: NCCL for device tensors and gloo for host ones, which a
    CPU-offloaded shard or vLLM's world group (a gloo `cpu_group`) may put into a collective; an
    NCCL-only group fails those with "No backend type associated with device type cpu". The
    device is set first and bound with `device_id`: NCCL then starts eagerly on the right GPU, and
    later `new_group` calls (vLLM builds a dozen) can split its communicator instead of starting
    new ones.
    """
    cuda = device.type == "cuda"
    if cuda:
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        os.environ.update(MASTER_ADDR=master_addr, MASTER_PORT=str(master_port))
        backend = "cpu:gloo,cuda:nccl" if cuda else "gloo"
        bind = {"device_id": device} if cuda else {}
        timeout = timedelta(seconds=timeout_s)
        dist.init_process_group(backend, rank=rank, world_size=world_size, timeout=timeout,
                                store=loopback_store(rank, world_size, master_addr, master_port, timeout), **bind)
    return init_device_mesh(device.type, (world_size,))


def loopback_store(rank: int, world_size: int, master_addr: str, master_port: int,
                   timeout: timedelta) -> dist.TCPStore | None:
    """On a one-machine cluster (the rendezvous on 127.0.0.1), a store that listens there only: torch's
    own binds every interface, which would offer a private run's rendezvous to the network. None
    elsewhere: torch's default store, reachable from the other nodes."""
    if not ipaddress.ip_address(master_addr).is_loopback:
        return None
    os.environ.setdefault("NCCL_SOCKET_IFNAME", "lo")  # NCCL's bootstrap sockets too: every rank is here
    listen = None
    if rank == 0:
        listen = socket.socket()
        listen.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listen.bind((master_addr, master_port))
        listen.listen()
    store = dist.TCPStore(master_addr, master_port, world_size, rank == 0, timeout,
                          master_listen_fd=listen.fileno() if listen else None)
    if listen is not None:
        listen.detach()  # the store owns the descriptor now
    return store


def _layer_classes(model: torch.nn.Module) -> set[str]:
    """HF names the blocks that must not be split (e.g. Qwen2DecoderLayer): one FSDP unit each."""
    for module in model.modules():
        names = getattr(module, "_no_split_modules", None)
        if names:
            return set(names)
    return set()


def shard_model(model: torch.nn.Module, mesh: DeviceMesh, device: torch.device,
                param_offload: bool = False, compute_dtype: torch.dtype | None = None) -> torch.nn.Module:
    """Shard `model` in place with fully_shard (per decoder layer, then the root) and return it.

    `compute_dtype`, when given, is the dtype forward and backward run in while the model keeps
    its own (fp32 master weights, models/loading.py master_dtype): FSDP2 casts each unit's
    gathered parameters to it, and reduce-scatters and stores gradients in fp32 (verl's
    MixedPrecisionPolicy). None: compute in the parameters' own dtype (the reference, LoRA).

    The model may be on the CPU or on the meta device: fully_shard moves each unit's parameters to
    `device` as it shards them, so the whole model is never on the device at once.

    A quantized base's 4-bit weights (models/quantize.py) are left out (`ignored_params`): each rank
    keeps its whole frozen copy, unsharded and uncast (they dequantize in forward), and no gradient
    of theirs is reduced.
    """
    from logicrl.models.quantize import is_quantized
    # Parameter offload only means something with an accelerator: CPU ranks already hold them on CPU.
    offload = CPUOffloadPolicy() if param_offload and device.type == "cuda" else None
    kwargs = {"mesh": mesh, **({"offload_policy": offload} if offload else {})}
    if ignored := {p for p in model.parameters() if is_quantized(p)}:
        kwargs["ignored_params"] = ignored
    if compute_dtype is not None:
        kwargs["mp_policy"] = MixedPrecisionPolicy(param_dtype=compute_dtype, reduce_dtype=torch.float32)
    layers = _layer_classes(model)
    for module in model.modules():
        if type(module).__name__ in layers:
            fully_shard(module, **kwargs)
    fully_shard(model, **kwargs)
    return model


def build_optimizer(model: torch.nn.Module, lr: float, weight_decay: float, total_steps: int,
                    warmup_ratio: float, schedule: str, warmup_steps: int = -1):
    """AdamW over the trainable parameters with linear warm-up, then constant or cosine decay.

    The warm-up lasts `warmup_steps` optimizer steps when it is >= 0, else warmup_ratio x total_steps
    (verl's optim.lr_warmup_steps and lr_warmup_steps_ratio)."""
    params = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=lr, weight_decay=weight_decay, betas=(0.9, 0.999))
    warmup = warmup_steps if warmup_steps >= 0 else int(warmup_ratio * total_steps)

    def factor(step: int) -> float:
        if step < warmup:
            return (step + 1) / (warmup + 1)
        if schedule == "cosine":
            progress = (step - warmup) / max(1, total_steps - warmup)
            return 0.5 * (1.0 + math.cos(math.pi * min(1.0, progress)))
        return 1.0

    return optimizer, torch.optim.lr_scheduler.LambdaLR(optimizer, factor)


def clip_grad_norm(model: torch.nn.Module, max_norm: float, device: torch.device | None = None) -> float:
    """Clip the global gradient norm (over all shards) and return it, taken before clipping.

    verl's fsdp2_clip_grad_norm_: torch's clip_grad_norm_ would reduce the norm where the gradients
    are, on the host when they are offloaded. Here each rank's norm over its local shards is taken
    where they live (a Partial DTensor, nothing sent yet), moved to `device` (None: the mesh's) and
    reduced there, and each local shard is scaled in place by the one clip factor.
    """
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    if not grads:
        return 0.0
    norm = full_tensor(torch.nn.utils.get_total_norm(grads, 2.0), device)
    coef = torch.clamp(max_norm / (norm + 1e-6), max=1.0)  # torch's clip_grads_with_norm_ factor
    on = {}  # one copy of the factor per device (offloaded grads: one device-to-host copy, not one each)
    for grad in grads:
        local = grad.to_local() if hasattr(grad, "to_local") else grad
        if local.device not in on:
            on[local.device] = coef.to(local.device)
        local.mul_(on[local.device])
    return float(norm)


def has_nonfinite(tensors) -> bool:
    """Whether any of `tensors` (a rank's parameters or optimizer states) holds a NaN or inf in its local shard.

    One min-max pass over each tensor where it lives (offloaded ones on the host), the extremes stacked
    per device and read back once per device: NaN and +-inf survive a min-max, and unlike a sum or a
    norm a large finite value cannot overflow into a false alarm. torch's inf-norm does the same job
    several times slower on the host (docs/faults.md, "Divergence"). Not a collective.
    """
    extremes: dict[torch.device, list[torch.Tensor]] = {}
    for t in tensors:
        t = (t.to_local() if hasattr(t, "to_local") else t).detach()
        if t.is_floating_point() and t.numel():
            extremes.setdefault(t.device, []).extend(torch.aminmax(t))
    return not all(bool(torch.stack([e.float() for e in found]).isfinite().all()) for found in extremes.values())


def optimizer_tensors(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """AdamW's state tensors (exp_avg, exp_avg_sq; the step count is not floating-point state)."""
    return [v for state in optimizer.state.values() for k, v in state.items() if k != "step" and torch.is_tensor(v)]


def offload_optimizer(optimizer: torch.optim.Optimizer) -> None:
    """Move AdamW's states (exp_avg, exp_avg_sq) to the host: `optimizer_offload` between updates.

    Blocking copies: a non-blocking one into pageable memory could be read before it lands, and
    pinning the states would hold as much pinned host memory for the whole run. `step` stays where
    torch put it (a host scalar unless the optimizer is fused or capturable).
    """
    _move_states(optimizer, lambda _param: torch.device("cpu"))


def load_optimizer(optimizer: torch.optim.Optimizer) -> None:
    """Bring AdamW's states back beside their parameters for the step. A parameter on the host
    (CPUOffloadPolicy, or a CPU rank) keeps them there: its step runs on the host anyway."""
    _move_states(optimizer, lambda param: param.device)


def _move_states(optimizer: torch.optim.Optimizer, where) -> None:
    for param, state in optimizer.state.items():
        target = where(param)
        for key, value in state.items():
            if key != "step" and torch.is_tensor(value) and value.device != target:
                state[key] = value.to(target)


def reshard(model: torch.nn.Module) -> None:
    """Free the full parameters FSDP2 still holds once a forward-only pass is over.

    FSDP2 reshards each layer after its forward, but never the root unit (embeddings, final norm,
    lm_head or value head) after a forward: it expects the backward to use it next. After a no-grad
    pass (old_log_prob, ref, values) no backward comes, so the root stayed gathered until the next
    backward, and for the reference for good. Not a collective: resharding only drops this rank's
    full copy; the next forward gathers it again (one all-gather of the root per pass).
    """
    from torch.distributed.fsdp import FSDPModule

    for module in model.modules():
        if isinstance(module, FSDPModule):
            module.reshard()


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


def full_tensor(t: torch.Tensor, device: torch.device | None = None) -> torch.Tensor:
    """The whole tensor: a DTensor (an FSDP2 shard) is all-gathered, a plain tensor comes back as is.

    A shard on the host of a device mesh (param_offload's CPUOffloadPolicy) is first moved to
    `device` (None: this rank's device of the mesh's type), so the gather runs there, over NCCL,
    and its result is on the device; gathering it in place would run over gloo, through host
    memory, or fail in an NCCL-only group.
    """
    if not hasattr(t, "full_tensor"):
        return t
    target = device if device is not None else mesh_device(t.device_mesh)
    if t.device.type == "cpu" and target.type != "cpu":
        t = t.to(target)
    return t.full_tensor()


def mesh_device(mesh: DeviceMesh) -> torch.device:
    """This rank's device of the mesh's type: the current CUDA device (init_distributed sets it)."""
    if mesh.device_type == "cpu":
        return torch.device("cpu")
    return torch.device(mesh.device_type, getattr(torch, mesh.device_type).current_device())


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
