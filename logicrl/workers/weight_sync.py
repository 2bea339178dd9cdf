"""The actor's weights as the rollout engine names them, gathered bucket by bucket.

FSDP2 keeps each parameter sharded; the stream all-gathers parameters in module order until the next
would pass `bucket_mb`, hands the bucket over one tensor at a time and only then gathers the next: at
most one bucket is held, never a full state dict (verl's update_weights_bucket_mb). With `dtype` each
shard is cast before it is gathered (half the bytes for a bf16 engine, the same result). With LoRA each
adapted Linear is sent merged, W + scale * B @ A formed in fp32 (over a 4-bit base: dequant(W) + ..., the
function the trainer computes). `iter_adapter_weights` is the adapter-only sync (rollout.lora_sync=adapters):
the A/B matrices alone, for an engine that holds the base once; over a 4-bit base that engine first takes
the dequantized base once (`merge_lora=False`). Every stream counts the bytes it hands over; the transport
(workers/transport.py) carries it to the engine. docs/engines.md has the details.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Iterator

import torch

from logicrl.models.quantize import dequantized
from logicrl.workers.fsdp import full_tensor
from logicrl.workers.transport import TensorMeta

MB = 2**20


def _plain_name(name: str) -> str:
    """peft's 'base_model.model.x.q_proj.base_layer.weight' -> 'x.q_proj.weight'."""
    return name.removeprefix("base_model.model.").replace(".base_layer.", ".")


def _gathered(param: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """The whole parameter in `dtype` (None: its own), the shard cast before the all-gather. A 4-bit
    base weight (replicated, never a shard) is dequantized: the engine holds the compute dtype."""
    shard = dequantized(param.detach())
    if dtype is not None and shard.dtype != dtype:
        shard = shard.to(dtype)  # a DTensor stays sharded: only this rank's slice is converted
    return full_tensor(shard)


def _merged(param: torch.Tensor, layer, dtype: torch.dtype | None) -> torch.Tensor:
    """The gathered parameter, with its LoRA layer's active adapters folded in when it has one."""
    tensor = _gathered(param, dtype)
    if layer is not None:
        for adapter in layer.active_adapters:
            a = full_tensor(layer.lora_A[adapter].weight).detach()  # [r, in]
            b = full_tensor(layer.lora_B[adapter].weight).detach()  # [out, r]
            tensor = tensor + layer.scaling[adapter] * (b @ a).to(tensor.dtype)
    return tensor


def iter_engine_weights(model: torch.nn.Module, bucket_mb: float | None = None,
                        stats: dict | None = None, dtype: torch.dtype | None = None, merge_lora: bool = True
                        ) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full tensor) for every parameter of the plain HF model, LoRA merged in (merge_lora=False:
    the base alone, adapters left out), gathered in buckets of at most `bucket_mb` MiB (None: one
    tensor at a time), in `dtype` (None: as stored).

    stats, when given, receives `peak_bucket_bytes` (the largest bucket gathered, i.e. the most
    gathered bytes this stream held at once), `buckets` (how many were gathered) and `bytes` (all
    the bytes handed over).
    """
    try:
        from peft.tuners.lora import LoraLayer
    except ImportError:  # peft is a dependency; this only keeps the function usable without it
        LoraLayer = ()
    adapted = {name: m for name, m in model.named_modules() if LoraLayer and isinstance(m, LoraLayer)}
    limit = 0 if bucket_mb is None else bucket_mb * MB
    stats = {} if stats is None else stats
    stats.update(peak_bucket_bytes=0, buckets=0, bytes=0)
    bucket: deque[tuple[str, torch.Tensor]] = deque()
    held = 0

    def hand_over() -> Iterator[tuple[str, torch.Tensor]]:
        nonlocal held
        stats["peak_bucket_bytes"] = max(stats["peak_bucket_bytes"], held)
        stats["buckets"] += 1
        held = 0
        while bucket:  # popped, not iterated: a tensor the consumer is done with is freed at once
            yield bucket.popleft()

    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".lora_" in name:
                continue  # folded into its base weight by _merged
            owner = name.rsplit(".base_layer.", 1)[0] if ".base_layer." in name else None
            layer = adapted.get(owner) if merge_lora and name.endswith(".weight") else None
            # The full size as sent: a DTensor's shape is global, the dtype the one it is cast to.
            size = param.numel() * (dtype or param.dtype).itemsize
            if bucket and held + size > limit:
                yield from hand_over()  # before gathering: never a full bucket plus one more tensor
            bucket.append((_plain_name(name), _merged(param, layer, dtype)))
            held += size
            stats["bytes"] += size
        if bucket:
            yield from hand_over()


def iter_adapter_weights(model: torch.nn.Module, dtype: torch.dtype | None = None,
                         stats: dict | None = None) -> Iterator[tuple[str, torch.Tensor]]:
    """(peft name, full tensor) for every LoRA A/B matrix of the active adapters, in `dtype` (None: as
    stored), e.g. 'base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight'.

    Each tensor is its own copy, never the trained parameter's storage: an engine that keeps it
    (vLLM's adapter cache) must not see the next optimizer step, nor write into the trainer's (vLLM
    scales B in place). stats, when given, receives `bytes` and
    `tensors` (what was handed over).
    """
    stats = {} if stats is None else stats
    stats.update(bytes=0, tensors=0)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".lora_A." not in name and ".lora_B." not in name:
                continue
            tensor = _gathered(param, dtype)
            local = param.to_local() if hasattr(param, "to_local") else param
            if tensor.untyped_storage().data_ptr() == local.untyped_storage().data_ptr():
                # A plain parameter comes back as itself, a DTensor over one rank as a view of its
                # shard; vLLM scales lora_B in place (LoRALayerWeights.optimize): the trainer's, then.
                tensor = tensor.clone()
            stats["bytes"] += tensor.numel() * tensor.element_size()
            stats["tensors"] += 1
            yield name, tensor


def engine_weight_meta(model: torch.nn.Module, dtype: torch.dtype | None = None) -> list[TensorMeta]:
    """The names, shapes and dtypes `iter_engine_weights(model, dtype=dtype)` streams (LoRA merged or not,
    the names are the base's), read from the parameters without gathering any: a DTensor's shape is global."""
    return [TensorMeta(_plain_name(name), tuple(param.shape), dtype or param.dtype)
            for name, param in model.named_parameters() if ".lora_" not in name]


def adapter_meta(model: torch.nn.Module, dtype: torch.dtype | None = None) -> list[TensorMeta]:
    """The names, shapes and dtypes `iter_adapter_weights(model, dtype)` streams."""
    return [TensorMeta(name, tuple(param.shape), dtype or param.dtype)
            for name, param in model.named_parameters() if ".lora_A." in name or ".lora_B." in name]
