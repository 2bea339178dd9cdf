"""Which modules LoRA's `target_modules` picks, by peft's rules, without building the model.

    matches(target_modules, "model.layers.0.self_attn.q_proj")   # True for [q_proj] or "all-linear"
    module_names(path, spec)                                       # the model's module names

peft (tuners_utils.check_target_module_exists) matches a list entry against a module's full name
or any dotted suffix of it (`q_proj`, `self_attn.q_proj`), a string as a regular expression over the
whole full name (so the string "q_proj" matches nothing), and "all-linear" (any case) as every Linear
but the output layer. The names come from the checkpoint's safetensors header (a module's name is its
tensors' names less the last part), which is what the model holds whatever its architecture and costs
a header read; building the model on the meta device would need torch and transformers (seconds) before
the memory plan, which imports neither. Without safetensors (the embedded models, .bin-only or
config-only directories) they are derived from the Llama-style layout the planner models (spec.py).
"""

from __future__ import annotations

import re
from pathlib import Path

from logicrl.models.spec import ModelSpec
from logicrl.models.tiny import EMBEDDED_CONFIGS
from logicrl.models.weight_files import tensor_names

ALL_LINEAR = "all-linear"
ATTENTION = ("q_proj", "k_proj", "v_proj", "o_proj")
MLP = ("gate_proj", "up_proj", "down_proj")
# The Linears of a decoder layer (Qwen2/Llama names): what peft's all-linear adapts, what QLoRA quantizes.
LINEARS = ATTENTION + MLP


def is_all_linear(target_modules) -> bool:
    return isinstance(target_modules, str) and target_modules.lower() == ALL_LINEAR


def matches(target_modules, module: str) -> bool:
    """Whether peft adapts the module named `module` (a full dotted name) for `target_modules`."""
    if isinstance(target_modules, str):
        return re.fullmatch(target_modules, module) is not None
    return module in target_modules or any(module.endswith(f".{t}") for t in target_modules)


def target_matches(target: str, module: str) -> bool:
    """Whether one entry of a target list picks `module`."""
    return matches([target], module)


def layer_module(linear: str, layer: int = 0) -> str:
    """The full name of decoder layer `layer`'s Linear `linear` in the Llama-style layout."""
    return f"model.layers.{layer}.{'self_attn' if linear in ATTENTION else 'mlp'}.{linear}"


def spec_module_names(spec: ModelSpec) -> list[str]:
    """The Llama-style module names of a causal LM of `spec`'s shape (the layers' Linears and norms,
    embeddings, final norm, lm_head)."""
    names = ["model.embed_tokens", "model.norm", "lm_head"]
    for i in range(spec.num_layers):
        layer = f"model.layers.{i}"
        names += [layer_module(n, i) for n in ATTENTION + MLP]
        names += [f"{layer}.input_layernorm", f"{layer}.post_attention_layernorm"]
    return names


def module_names(path: str, spec: ModelSpec) -> list[str]:
    """The module names of the causal LM at `path`: from its safetensors header where it has one."""
    names = None if path in EMBEDDED_CONFIGS else tensor_names(Path(path))
    if not names:
        return spec_module_names(spec)
    modules = {name.rsplit(".", 1)[0] for name in names if "." in name}
    # A tied lm_head stores no tensor of its own, but the module exists and peft sees it.
    return sorted(modules | {"lm_head"})
