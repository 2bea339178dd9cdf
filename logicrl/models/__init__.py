"""Models: HF loading, the tiny embedded model, LoRA, log-prob kernels."""
