"""Quantized bases, torch-free: which methods logicrl runs, what they need, what a checkpoint carries.

The config schema, the validation and the planner read this before torch is imported; the
quantization itself is models/quantize.py.
"""

from __future__ import annotations

import importlib.util

# On-the-fly methods (actor_rollout_ref.model.quantization) and the module each needs.
METHODS = ("nf4",)
PACKAGE = {"nf4": "torchao"}
INSTALL = "pip install 'logicrl[quant]'"  # pyproject.toml's quant extra


def package_missing(method: str) -> str | None:
    """Why `method` cannot run here (its package is not installed), in one line; None when it can."""
    module = PACKAGE[method]
    if importlib.util.find_spec(module) is None:
        return f"quantization={method} needs {module}, which is not installed: {INSTALL} (or pip install {module})"
    return None


def nf4_bits(block_size: int, scaler_block_size: int, dtype_bytes: int) -> float:
    """Bits per weight of an NF4 base (torchao's layout): a 4-bit code per value, an int8 scale per
    block of `block_size`, and per group of `scaler_block_size` scales one factor in the weight's
    dtype. 4.126 at QLoRA's 64/256 in bf16 (bitsandbytes, with fp32 factors: 4.127)."""
    return 4 + 8 / block_size + 8 * dtype_bytes / (block_size * scaler_block_size)


def gptq_bits(bits: int, group_size: int) -> float:
    """Bits per weight of a GPTQ checkpoint's Linear: the packed `bits`-bit codes, and per group of
    `group_size` inputs one fp16 scale and one packed `bits`-bit zero point per output column (g_idx,
    one int32 per input row, is under 0.01 bits for a 3584-wide layer and left out). 4.156 at 4/128."""
    return bits + (16 + bits) / group_size


# Pre-quantized checkpoints logicrl loads (config.json quantization_config.quant_method), through
# transformers' quantizer integration (models/gptq.py), and the modules that integration imports.
PRE_QUANTIZED = {"gptq": ("gptqmodel", "optimum")}
GPTQ_INSTALL = "pip install 'logicrl[gptq]'"  # pyproject.toml's gptq extra (CPU installs: it has no wheel)


def pre_quantized_missing(method: str) -> str | None:
    """Why a `method` checkpoint cannot load here (its packages are not installed), in one line; None when it can."""
    missing = [m for m in PRE_QUANTIZED[method] if importlib.util.find_spec(m) is None]
    if missing:
        return (f"a {method} checkpoint loads through transformers' quantizer with "
                f"{' and '.join(PRE_QUANTIZED[method])}; "
                f"not installed: {', '.join(missing)}; {GPTQ_INSTALL} (docs/quantization.md)")
    return None


def pre_quantized_refusal(key: str, path: str, method: str) -> str:
    """The one line for a checkpoint whose config.json carries a quantization_config logicrl cannot load."""
    return (f"{key}={path} is a pre-quantized {method} checkpoint (config.json quantization_config): logicrl loads "
            f"{', '.join(PRE_QUANTIZED)} checkpoints only; train LoRA over the bf16 checkpoint with "
            "actor_rollout_ref.model.quantization=nf4 instead (docs/quantization.md)")
