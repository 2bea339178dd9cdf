"""Set-up the config tests share."""

import json


def write_checkpoint(path, architecture="Qwen2ForSequenceClassification", labels=1, max_positions=4096):
    """A config-only reward-model checkpoint (no weights) at `path`: what validation and the planner read."""
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps({
        "architectures": [architecture], "model_type": "qwen2", "hidden_size": 64, "num_hidden_layers": 2,
        "num_attention_heads": 1, "num_key_value_heads": 1, "head_dim": 64, "intermediate_size": 128,
        "vocab_size": 300, "max_position_embeddings": max_positions,
        "id2label": {str(i): f"LABEL_{i}" for i in range(labels)}}))
    return str(path)
