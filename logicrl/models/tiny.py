"""The embedded tiny model: a Qwen2-shaped decoder built from this config with random weights.

Sized for CPU tests and `make train`: small enough to train in minutes on 2 cores, big enough to
exercise every code path (GQA, tied embeddings, q/k/v biases). head_dim is 64 because vLLM's CPU
attention rejects some head sizes (16 fails). max_position_embeddings covers the Logic-RL recipes'
400 + 4096 tokens so they can be dry-run with it.
"""

TINY_CONFIG = {
    "model_type": "qwen2",
    "architectures": ["Qwen2ForCausalLM"],
    "hidden_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "num_key_value_heads": 1,
    "head_dim": 64,
    "intermediate_size": 352,
    "vocab_size": 2048,
    "max_position_embeddings": 8192,
    "tie_word_embeddings": True,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
}
