"""The actor's weights as the rollout engine names them, gathered one tensor at a time.

FSDP2 keeps each parameter sharded; `full_tensor()` all-gathers just that parameter, so the extra
memory at any moment is one parameter's full size, never a full state dict. With LoRA the engine
holds a plain model: each adapted Linear is sent merged (W + scale * B @ A), computed from the
gathered base weight and the two small adapter matrices, and nothing else is copied.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch


def _full(t: torch.Tensor) -> torch.Tensor:
    return (t.full_tensor() if hasattr(t, "full_tensor") else t).detach()


def _plain_name(name: str) -> str:
    """peft's 'base_model.model.x.q_proj.base_layer.weight' -> 'x.q_proj.weight'."""
    return name.removeprefix("base_model.model.").replace(".base_layer.", ".")


def iter_engine_weights(model: torch.nn.Module) -> Iterator[tuple[str, torch.Tensor]]:
    """(name, full tensor) pairs for every parameter of the plain HF model; LoRA merged in."""
    try:
        from peft.tuners.lora import LoraLayer
    except ImportError:  # peft is a dependency; this only keeps the function usable without it
        LoraLayer = ()
    adapted = {name: m for name, m in model.named_modules() if LoraLayer and isinstance(m, LoraLayer)}
    with torch.no_grad():
        for name, param in model.named_parameters():
            if ".lora_" in name:
                continue  # folded into its base weight below
            owner = name.rsplit(".base_layer.", 1)[0] if ".base_layer." in name else None
            tensor = _full(param)
            if owner in adapted and name.endswith(".weight"):
                layer = adapted[owner]
                for adapter in layer.active_adapters:
                    a = _full(layer.lora_A[adapter].weight)  # [r, in]
                    b = _full(layer.lora_B[adapter].weight)  # [out, r]
                    tensor = tensor + layer.scaling[adapter] * (b @ a).to(tensor.dtype)
            yield _plain_name(name), tensor
