"""What a model is, read from its HF config.json without importing transformers.

The preflight (validation, dry run, memory plan) must know a model's shape in well under a
second, before torch is imported, so this reads the JSON directly. It understands the
decoder-only families RL recipes use (Llama, Qwen2/2.5/3, Mistral, Gemma-like) and nested
`text_config` for multimodal checkpoints.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from logicrl.models.tiny import EMBEDDED_CONFIGS

# Tokens per chunk of the chunked lm_head (models/logprob.py, called by workers/actor.py): bounds
# the fp32 [chunk, V] logits alive at once. Kept here, torch-free, so the memory planner reads the
# number the workers run with.
LOGPROB_CHUNK_TOKENS = 1024


class ModelSpecError(ValueError):
    pass


@dataclass(frozen=True)
class ModelSpec:
    name: str
    model_type: str
    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    intermediate_size: int
    vocab_size: int
    max_position_embeddings: int | None
    tie_word_embeddings: bool
    attention_bias: bool
    # A pre-quantized checkpoint's quantization_config (GPTQ, AWQ, ...): its method, bits and group size.
    quant_method: str | None = None
    quant_bits: int | None = None
    quant_group_size: int | None = None

    @classmethod
    def from_dict(cls, cfg: dict, name: str) -> ModelSpec:
        quant = cfg.get("quantization_config") or {}
        cfg = cfg.get("text_config", cfg)
        try:
            hidden, heads = int(cfg["hidden_size"]), int(cfg["num_attention_heads"])
            return cls(
                name=name,
                model_type=str(cfg.get("model_type", "unknown")),
                num_layers=int(cfg["num_hidden_layers"]),
                hidden_size=hidden,
                num_heads=heads,
                num_kv_heads=int(cfg.get("num_key_value_heads") or heads),
                head_dim=int(cfg.get("head_dim") or hidden // heads),
                intermediate_size=int(cfg["intermediate_size"]),
                vocab_size=int(cfg["vocab_size"]),
                max_position_embeddings=cfg.get("max_position_embeddings"),
                tie_word_embeddings=bool(cfg.get("tie_word_embeddings", False)),
                # Qwen2 has q/k/v biases without saying so in its config.
                attention_bias=bool(cfg.get("attention_bias", cfg.get("model_type") == "qwen2")),
                quant_method=quant.get("quant_method") if quant else None,
                quant_bits=quant.get("bits") if quant else None,
                quant_group_size=quant.get("group_size") if quant else None,
            )
        except KeyError as e:
            raise ModelSpecError(f"{name}: config.json lacks {e.args[0]!r}") from None

    def num_params(self) -> int:
        """Parameter count of a Llama-style decoder (embeddings, attention, gated MLP, RMSNorms)."""
        h, hd = self.hidden_size, self.head_dim
        q, kv = self.num_heads * hd, self.num_kv_heads * hd
        attn = h * q + 2 * h * kv + q * h + (q + 2 * kv if self.attention_bias else 0)
        mlp = 3 * h * self.intermediate_size
        per_layer = attn + mlp + 2 * h
        embed = self.vocab_size * h * (1 if self.tie_word_embeddings else 2)
        return embed + self.num_layers * per_layer + h

    def describe(self) -> str:
        return (f"{self.name} ({self.model_type}: {self.num_layers} layers, hidden {self.hidden_size}, "
                f"{self.num_heads} heads / {self.num_kv_heads} kv x {self.head_dim}, vocab {self.vocab_size}, "
                f"max positions {self.max_position_embeddings}): {self.num_params() / 1e6:,.1f}M parameters")


def load_model_spec(path: str) -> ModelSpec:
    """The spec for `path`: the embedded tiny model, or a local HF checkpoint directory."""
    if path in EMBEDDED_CONFIGS:
        return ModelSpec.from_dict(EMBEDDED_CONFIGS[path], path)
    cfg_file = Path(path) / "config.json"
    try:
        return ModelSpec.from_dict(json.loads(cfg_file.read_text()), path)
    except OSError as e:
        raise ModelSpecError(f"{cfg_file}: {e}") from None
    except json.JSONDecodeError as e:
        raise ModelSpecError(f"{cfg_file} is not valid JSON ({e}): fix it or copy the checkpoint's config.json "
                             "again") from None
