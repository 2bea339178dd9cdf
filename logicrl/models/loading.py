"""Loading the policy and critic from a local HF checkpoint (or the embedded tiny model).

Two dtypes: the compute dtype (`actor_rollout_ref.model.dtype`, `resolve_dtype`) is what forward
and backward run in, what the reference and the rollout engine hold; the master dtype
(`master_dtype`) is what the trained actor and critic store and AdamW updates: fp32 whenever the
compute dtype is narrower, since at Logic-RL's lr 4e-7 a bf16 weight rounds almost every update
away. FSDP2 casts the masters to the compute dtype per layer (workers/fsdp.py).

With several ranks only rank 0 reads the checkpoint; every rank builds the model on the meta
device (`on_meta`) and receives its shards (workers/sharded_load.py). The
embedded tiny model is built once: random weights from a fixed seed, briefly pre-trained on the
project's own K&K text (models/tiny_pretrain.py), saved beside its config and tokenizer, so
every rank and every run starts from the same model.
"""

from __future__ import annotations

import logging
import os
import tempfile
import warnings
from dataclasses import dataclass
from pathlib import Path

import torch

from logicrl.models.eos import eos_ids
from logicrl.models.spec import load_model_spec
from logicrl.models.tiny import EMBEDDED_TINY, EMBEDDED_TINY_RM, exclusive, tiny_checkpoint_dir
from logicrl.models.tiny_pretrain import pretrain
from logicrl.models.tiny_rm import tiny_rm_checkpoint_dir

log = logging.getLogger("logicrl.models")
TINY_WEIGHTS_SEED = 0
WEIGHTS_FILE = "model.safetensors"


@dataclass(frozen=True)
class LoraSpec:
    rank: int
    alpha: float
    target_modules: str | list[str]


@dataclass(frozen=True)
class QuantSpec:
    """A frozen 4-bit base (models/quantize.py): the method, its block sizes, and the device the
    weights are quantized on and kept."""

    method: str
    block_size: int
    scaler_block_size: int
    device: torch.device | None = None


def resolve_dtype(name: str, device: torch.device) -> torch.dtype:
    if name == "auto":
        # bf16 on CPU is emulated and slow, and fp32 keeps the engine/trainer log-prob checks tight.
        return torch.bfloat16 if device.type == "cuda" else torch.float32
    return getattr(torch, name)


def master_dtype(compute: torch.dtype) -> torch.dtype:
    """The dtype trained weights and their AdamW states are kept in: fp32 below fp32, else `compute`."""
    return torch.float32 if torch.finfo(compute).bits < 32 else compute


def quiet_transformers() -> None:
    # One "Loading weights" bar per model per rank drowns the step log; load errors still raise.
    from transformers.utils import logging as hf_logging

    hf_logging.disable_progress_bar()


def checkpoint_dir(path: str) -> Path:
    """The directory to load from: `path` itself, or an embedded model's cache (built once)."""
    if path == EMBEDDED_TINY_RM:
        return tiny_rm_checkpoint_dir()
    if path != EMBEDDED_TINY:
        return Path(path)
    directory = tiny_checkpoint_dir()
    if not (directory / WEIGHTS_FILE).is_file():
        with exclusive(directory.parent / f".{directory.name}-weights.lock"):  # beside it: not a checkpoint file
            if not (directory / WEIGHTS_FILE).is_file():  # or another process wrote them while this one waited
                _write_tiny_weights(directory)
    return directory


def _write_tiny_weights(directory: Path) -> None:
    from safetensors.torch import save_file
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    print(f"logicrl: building the embedded tiny model in {directory} (first run only: ~20 s of pre-training)",
          flush=True)
    config = AutoConfig.from_pretrained(directory, local_files_only=True)
    torch.manual_seed(TINY_WEIGHTS_SEED)
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    pretrain(model, AutoTokenizer.from_pretrained(directory, local_files_only=True))
    # Tied lm_head shares storage with the embedding; safetensors refuses shared tensors, and
    # from_pretrained re-ties them from config.tie_word_embeddings anyway.
    state = {k: v.contiguous() for k, v in model.state_dict().items() if k != "lm_head.weight" or
             not config.tie_word_embeddings}
    fd, tmp = tempfile.mkstemp(dir=directory, suffix=".tmp")
    os.close(fd)
    save_file(state, tmp, metadata={"format": "pt"})
    os.replace(tmp, directory / WEIGHTS_FILE)  # atomic: concurrent ranks see all of it or none


def load_tokenizer(path: str, quiet: bool = False):
    """The checkpoint's tokenizer; without a pad token it pads with eos (said once, unless `quiet`:
    every process loads it, the preflight says it for all of them). Its eos, or generation_config's
    first eos_token_id when it has none, is checked by preflight/models.py before a run starts."""
    from transformers import AutoTokenizer

    directory = checkpoint_dir(path)
    tokenizer = AutoTokenizer.from_pretrained(directory, local_files_only=True)
    if tokenizer.eos_token is None and (stops := eos_ids(tokenizer, directory)):
        tokenizer.eos_token = tokenizer.convert_ids_to_tokens(stops[0])
        if not quiet:
            log.info(f"{path}: the tokenizer has no eos token; using generation_config.json's {tokenizer.eos_token!r}")
    if tokenizer.pad_token_id is None and tokenizer.eos_token is not None:
        tokenizer.pad_token = tokenizer.eos_token
        if not quiet:
            log.info(f"{path}: the tokenizer has no pad token; padding with its eos {tokenizer.eos_token!r}")
    return tokenizer


def load_causal_lm(path: str, dtype: torch.dtype, gradient_checkpointing: bool = False,
                   lora: LoraSpec | None = None, on_meta: bool = False,
                   attn_implementation: str | None = None, quant: QuantSpec | None = None) -> torch.nn.Module:
    """The policy on CPU in `dtype`; with `lora`, wrapped by peft (only adapter weights train); with
    `quant`, its decoder Linears quantized first (QLoRA: peft then adapts the 4-bit Linears). A GPTQ
    checkpoint loads as it is stored: int4 Linears, the rest in `dtype` (models/gptq.py).

    `on_meta`: the same model with every tensor on the meta device and nothing read from disk,
    for a rank that receives its shards from rank 0 (workers/sharded_load.py).
    `attn_implementation`: transformers' name, None for its default (sdpa); see models/attention.py."""
    from transformers import AutoModelForCausalLM

    quiet_transformers()
    pre_quantized = load_model_spec(path).quant_method  # config.json's quantization_config
    if on_meta:
        if pre_quantized:
            raise ValueError(f"a {pre_quantized} checkpoint's int4 buffers are read by every rank (on_meta=False)")
        model = _on_meta(AutoModelForCausalLM, path, dtype, attn_implementation)
    elif pre_quantized == "gptq":
        # A frozen int4 base: transformers' GPTQ quantizer with gptqmodel's torch kernel (models/gptq.py).
        from logicrl.models.gptq import eager_dequantize, gptq_load_kwargs

        with warnings.catch_warnings():  # "the quantization_config from the model will be used": as intended
            warnings.filterwarnings("ignore", "You passed `quantization_config`")
            model = AutoModelForCausalLM.from_pretrained(checkpoint_dir(path), dtype=dtype, local_files_only=True,
                                                         attn_implementation=attn_implementation,
                                                         **gptq_load_kwargs())
        eager_dequantize(model)
    else:
        model = AutoModelForCausalLM.from_pretrained(checkpoint_dir(path), dtype=dtype, local_files_only=True,
                                                     attn_implementation=attn_implementation)
    if quant is not None:
        if on_meta:
            raise ValueError("a quantized base is quantized from real weights: every rank loads it (on_meta=False)")
        from logicrl.models.quantize import quantize_base

        quantize_base(model, quant.method, quant.block_size, quant.scaler_block_size, quant.device)
    return _prepare(model, gradient_checkpointing, lora)


def load_value_model(path: str, dtype: torch.dtype, gradient_checkpointing: bool = False,
                     on_meta: bool = False, attn_implementation: str | None = None) -> torch.nn.Module:
    """The critic: the checkpoint's decoder with a fresh one-output token head (verl's choice), and
    no dropout before that head: transformers' token heads default to 0.1, which made the update's
    values (train mode) differ from the rollout's (eval mode) that value clipping compares them with,
    and a retried micro-batch draw other masks (verl sets it to 0 too)."""
    from transformers import AutoConfig, AutoModelForTokenClassification

    quiet_transformers()
    config = AutoConfig.from_pretrained(checkpoint_dir(path), local_files_only=True, num_labels=1)
    config.classifier_dropout = 0.0  # not a field of most decoder configs: set, not passed as a kwarg
    if on_meta:
        with torch.device("meta"):
            model = AutoModelForTokenClassification.from_config(config, dtype=dtype,
                                                                attn_implementation=attn_implementation)
    else:
        model = AutoModelForTokenClassification.from_pretrained(checkpoint_dir(path), config=config, dtype=dtype,
                                                                local_files_only=True,
                                                                attn_implementation=attn_implementation)
    return _prepare(model, gradient_checkpointing, None)


def _on_meta(auto_class, path: str, dtype: torch.dtype, attn_implementation: str | None = None,
             **config_kwargs) -> torch.nn.Module:
    """The checkpoint's architecture from its config.json alone, every parameter and buffer on meta.

    Buffers computed in __init__ (RoPE's inv_freq) are meta too; the sharded load copies them from
    rank 0's real model, as it does the weights."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(checkpoint_dir(path), local_files_only=True, **config_kwargs)
    with torch.device("meta"):
        return auto_class.from_config(config, dtype=dtype, attn_implementation=attn_implementation)


def _prepare(model: torch.nn.Module, gradient_checkpointing: bool, lora: LoraSpec | None) -> torch.nn.Module:
    model.config.use_cache = False  # training forwards never reuse a KV cache
    if gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    if lora is not None:
        from peft import LoraConfig, get_peft_model

        targets = lora.target_modules if isinstance(lora.target_modules, str) else list(lora.target_modules)
        # autocast_adapter_dtype=True (peft's default, named so that nobody turns it off): the
        # adapters are stored fp32 under a bf16 base. They are the trained weights, so they are the
        # fp32 masters of models/loading.py master_dtype; the actor's FSDP2 policy gathers them in
        # the compute dtype (workers/build.py), so they do not compute in fp32. Stored in bf16,
        # Logic-RL's lr 4e-7 updates would round away as they would for a full bf16 model.
        model = get_peft_model(model, LoraConfig(r=lora.rank, lora_alpha=lora.alpha, target_modules=targets,
                                                 lora_dropout=0.0, bias="none", task_type="CAUSAL_LM"),
                               autocast_adapter_dtype=True)
    return model
