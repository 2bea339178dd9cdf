"""vLLM's per-sync "Failed to load weights" warnings: dropped for the layers no checkpoint writes (the
rotary cache, a tied lm_head), kept for any other layer (workers/rollout/vllm.py ExpectedAbsent)."""

import logging

from logicrl.workers.rollout.vllm import ExpectedAbsent


def record(layer: str, msg: str = "%s: Failed to load weights") -> logging.LogRecord:
    return logging.LogRecord("vllm.model_executor.model_loader.reload.layerwise", logging.WARNING, __file__, 1,
                             msg, (layer,), None)


def test_only_the_expected_layers_are_dropped():
    tied, untied = ExpectedAbsent(tied_lm_head=True), ExpectedAbsent(tied_lm_head=False)
    assert not tied.filter(record("RotaryEmbedding")) and not untied.filter(record("Llama3RotaryEmbedding"))
    assert not tied.filter(record("ParallelLMHead"))
    assert untied.filter(record("ParallelLMHead"))  # an untied lm_head not written is a real failure
    assert tied.filter(record("QKVParallelLinear"))
    assert tied.filter(record("RotaryEmbedding", msg="%s: Delayed processing"))
