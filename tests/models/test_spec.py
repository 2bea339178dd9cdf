"""ModelSpec reads config.json without transformers; its parameter count must match the real model."""

import json

import pytest

from logicrl.models.spec import ModelSpecError, load_model_spec
from logicrl.models.tiny import EMBEDDED_CONFIGS, EMBEDDED_TINY


def real_param_count(cfg: dict) -> int:
    import transformers

    config = transformers.AutoConfig.for_model(**cfg)
    model = transformers.AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in model.parameters())


def test_tiny_spec_matches_transformers():
    spec = load_model_spec("embedded:tiny")
    assert spec.head_dim == 64  # vLLM's CPU attention rejects smaller head sizes
    assert spec.num_params() == real_param_count(EMBEDDED_CONFIGS[EMBEDDED_TINY])  # the trained vocabulary's


def test_untied_llama_without_bias_matches_transformers(tmp_path):
    cfg = {"model_type": "llama", "hidden_size": 96, "num_hidden_layers": 3, "num_attention_heads": 4,
           "num_key_value_heads": 2, "intermediate_size": 200, "vocab_size": 300, "max_position_embeddings": 512,
           "tie_word_embeddings": False}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    spec = load_model_spec(str(tmp_path))
    assert (spec.head_dim, spec.attention_bias) == (24, False)
    assert spec.num_params() == real_param_count(cfg)


def test_hand_count_of_a_one_layer_model(tmp_path):
    # hidden 4, 1 head of 4, 1 kv head, mlp 8, vocab 10, tied, no bias:
    # embed 40; attn q 16 + k 16 + v 16 + o 16 = 64; mlp 3 * 4 * 8 = 96; 2 norms 8; final norm 4 -> 212
    (tmp_path / "config.json").write_text(json.dumps({
        "model_type": "llama", "hidden_size": 4, "num_hidden_layers": 1, "num_attention_heads": 1,
        "intermediate_size": 8, "vocab_size": 10, "tie_word_embeddings": True}))
    assert load_model_spec(str(tmp_path)).num_params() == 212


def test_missing_field_is_named(tmp_path):
    (tmp_path / "config.json").write_text(json.dumps({"hidden_size": 4}))
    with pytest.raises(ModelSpecError, match="num_attention_heads|num_hidden_layers"):
        load_model_spec(str(tmp_path))
