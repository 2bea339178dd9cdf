"""A frozen 4-bit base under LoRA adapters (QLoRA): NF4 on the fly, through torchao's NF4Tensor.

    quantize_base(model, method, block_size, scaler_block_size, device)  # before peft wraps the model
    is_quantized(param)        # an NF4 weight: FSDP2 leaves it replicated (workers/fsdp.py shard_model)
    dequantized(tensor)        # the weight in its compute dtype, for the merged sync and export

torchao, not bitsandbytes: plain torch, so the same code runs on CPU ranks and CUDA under FSDP2. Every
Linear inside the decoder layers is quantized in blocks of `block_size`, its scales again to int8 in
blocks of `scaler_block_size` (0.5 + 1/64 bytes per parameter at the defaults, quant_methods.py). The
base is kept whole on every rank (FSDP2's ignored_params: it cannot shard an NF4 weight along any row),
and the forward dequantizes one layer's weight at a time, in backward again. Why and what it costs:
docs/quantization.md, "What happens".
"""

from __future__ import annotations

import math

import torch

from logicrl.models.lora_targets import LINEARS
from logicrl.models.quant_methods import METHODS


class QuantizationError(ValueError):
    pass


def _import_nf4():
    """torchao's NF4 pieces (under quantization/ in 0.18, dtypes/ in older releases). Its import warnings
    about CUDA-only extensions are silenced in logicrl/__init__.py: NF4Tensor needs none of them."""
    try:
        from torchao.quantization.quantize_.workflows.nf4.nf4_tensor import (
            NF4Tensor,
            linear_nf4,
            to_nf4,
        )
    except ImportError:
        from torchao.dtypes.nf4tensor import NF4Tensor, linear_nf4, to_nf4
    return NF4Tensor, linear_nf4, to_nf4


class NF4Linear(torch.nn.Linear):
    """An nn.Linear whose frozen weight is an NF4Tensor; forward dequantizes it into the input's dtype.

    A subclass, so peft still recognises it as a Linear to adapt (it wraps it as `base_layer`)."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        _, linear_nf4, _ = _import_nf4()
        out = linear_nf4(x, self.weight)
        return out if self.bias is None else out + self.bias.to(out.dtype)


def scaler_block(numel: int, block_size: int, scaler_block_size: int) -> int:
    """The scaler block torchao gets for a weight of `numel` values: `scaler_block_size`, or the largest
    common divisor with the weight's block count when it does not divide it (the tiny model's 352-wide
    MLP has 704 blocks: scalers in blocks of 64). torchao refuses a block count it does not divide."""
    return math.gcd(numel // block_size, scaler_block_size)


def quantizable(weight_shape: tuple[int, ...], block_size: int) -> bool:
    return len(weight_shape) == 2 and math.prod(weight_shape) % block_size == 0


def quantize_base(model: torch.nn.Module, method: str, block_size: int, scaler_block_size: int,
                  device: torch.device | None = None) -> int:
    """Quantize every decoder-layer Linear of `model` in place (before peft wraps it); returns how many.

    `device`: where the weight is quantized and then lives (the rank's device: quantizing a 7B on the
    host takes minutes). The weight's dtype when quantized is the dtype it dequantizes back to, so the
    model must already be in its compute dtype. A weight whose size is not a multiple of `block_size`
    is refused: torchao cannot block it, and a silently unquantized layer would break the plan."""
    if method not in METHODS:
        raise QuantizationError(f"quantization={method}: logicrl quantizes on the fly with {', '.join(METHODS)}")
    _, _, to_nf4 = _import_nf4()
    count = 0
    for name, module in model.named_modules():
        if type(module) is not torch.nn.Linear or name.rsplit(".", 1)[-1] not in LINEARS:
            continue
        weight = module.weight.detach()
        if not quantizable(tuple(weight.shape), block_size):
            raise QuantizationError(f"{name}.weight {tuple(weight.shape)} is not a multiple of the NF4 block of "
                                    f"{block_size} values: lower actor_rollout_ref.model.quantization_block_size")
        if device is not None:
            weight = weight.to(device)
        nf4 = to_nf4(weight.contiguous(), block_size, scaler_block(weight.numel(), block_size, scaler_block_size))
        module.weight = torch.nn.Parameter(nf4, requires_grad=False)
        module.__class__ = NF4Linear
        count += 1
    return count


def is_quantized(tensor: torch.Tensor) -> bool:
    """Whether `tensor` is an NF4 weight (false, and nothing imported, when torchao is not in use)."""
    import sys

    if "torchao" not in sys.modules:
        return False
    NF4Tensor, _, _ = _import_nf4()
    return isinstance(tensor, NF4Tensor) or isinstance(getattr(tensor, "data", None), NF4Tensor)


def dequantized(tensor: torch.Tensor) -> torch.Tensor:
    """`tensor` itself, or an NF4 weight dequantized into its compute dtype (a new full tensor)."""
    if is_quantized(tensor):
        return tensor.get_original_weight()
    return tensor
