"""A pre-quantized GPTQ checkpoint as the frozen base under LoRA adapters.

    gptq_load_kwargs()                # what from_pretrained needs to load one (models/loading.py)
    eager_dequantize(model)           # undo gptqmodel's torch.compile of each Linear's dequantize

transformers loads it through its own quantizer: optimum swaps each decoder Linear for a gptqmodel
QuantLinear holding the int4 codes, scales and zeros as *buffers*, so nothing of the base trains, FSDP2
never shards it (the base is whole on every rank, as the plan counts it) and checkpoints never hold it;
peft wraps those modules as an nn.Linear, so only the adapters train. The kernel is `gptq_torch` (plain
torch on CPU and CUDA, the one gptqmodel marks trainable on both); its dequantize is put back to eager,
since torch.compile's C++ build costs each process far more than the few ops it compiles
(docs/quantization.md, "Kernel").
"""

from __future__ import annotations

import torch

BACKEND = "gptq_torch"


def gptq_load_kwargs() -> dict:
    """from_pretrained's extra arguments for a GPTQ checkpoint: the checkpoint's own quantization_config
    (bits, group size, format), with only the kernel chosen here (transformers takes `backend` from the
    passed config and the rest from config.json)."""
    from transformers import GPTQConfig

    return {"quantization_config": GPTQConfig(bits=4, backend=BACKEND)}


def eager_dequantize(model: torch.nn.Module) -> int:
    """Drop each QuantLinear's compiled `dequantize_weight` (an instance attribute gptqmodel's optimize()
    sets over the class's method), so forwards run it eagerly; returns how many modules held one."""
    count = 0
    for module in model.modules():
        if "dequantize_weight" in vars(module):
            del module.dequantize_weight
            count += 1
    return count


def is_gptq_linear(module: torch.nn.Module) -> bool:
    """Whether `module` is a gptqmodel QuantLinear (it has the packed int4 codes `qweight`)."""
    return isinstance(getattr(module, "qweight", None), torch.Tensor) and hasattr(module, "dequantize_weight")


def to_device_keeping_buffers(model: torch.nn.Module, device: torch.device, dtype: torch.dtype) -> torch.nn.Module:
    """`model` on `device` with its parameters in `dtype` and its buffers as stored: nn.Module.to(dtype)
    would also cast the int4 Linears' fp16 scales, and the rollout engine would dequantize another base
    than the trainer, where FSDP2 moves buffers without casting them."""
    model.to(device=device)
    with torch.no_grad():
        for param in model.parameters():
            param.data = param.data.to(dtype)
    return model
