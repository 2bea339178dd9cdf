"""A tiny random Qwen2 (the embedded model's shape), built offline with a fixed seed."""

import pytest
import torch
import transformers


def build_tiny_qwen2(seed: int = 0):
    torch.manual_seed(seed)
    config = transformers.Qwen2Config(hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                                      num_key_value_heads=1, head_dim=64, intermediate_size=352,
                                      vocab_size=2048, tie_word_embeddings=True)
    return transformers.AutoModelForCausalLM.from_config(config)


@pytest.fixture
def make_tiny_qwen2():
    """For tests that change a model's weights or mode: a fresh model per call."""
    return build_tiny_qwen2


@pytest.fixture(scope="module")
def tiny_qwen2():
    """Shared by a module's tests; tests that change weights or mode build their own."""
    return build_tiny_qwen2().eval()


def trainer_inputs(prompts, out, pad_id):
    """The trainer's view of a rollout (logicrl.trainer.batch.build_batch): [B*n, P+R] ids, mask, positions."""
    from logicrl.trainer.batch import build_batch

    batch = build_batch([prompts[i] for i in out.prompt_index.tolist()], out.responses, out.response_mask, pad_id)
    return batch["input_ids"], batch["attention_mask"], batch["position_ids"]


def assert_engine_logprobs_match(model, prompts, out, params, pad_id):
    """The engine's log-probs of its sampled tokens equal the trainer's recomputation (fp32), 0 where masked."""
    from logicrl.models.logprob import causal_lm_logprobs

    input_ids, attention_mask, position_ids = trainer_inputs(prompts, out, pad_id)
    with torch.no_grad():
        recomputed, _ = causal_lm_logprobs(model, input_ids, attention_mask, position_ids, params.max_tokens,
                                           temperature=params.logprob_temperature, chunk_tokens=16)
    mask = out.response_mask.bool()
    torch.testing.assert_close(out.log_probs[mask], recomputed[mask], atol=1e-4, rtol=0)
    assert (out.log_probs[~mask] == 0).all()


def assert_stops_right_after_eos(free, out, eos: int, pad_id: int, max_tokens: int):
    """`out` (generated with eos as a stop id) is `free` (without it) cut just after each row's first
    eos: the mask covers up to and including it, the rest is pad with log-prob 0."""
    for row in range(free.responses.shape[0]):
        hits = (free.responses[row] == eos).nonzero()
        length = hits[0].item() + 1 if len(hits) else max_tokens  # up to and including the first EOS
        assert out.response_mask[row].tolist() == [1] * length + [0] * (max_tokens - length)
        assert torch.equal(out.responses[row, :length], free.responses[row, :length])
        assert (out.responses[row, length:] == pad_id).all()
        assert (out.log_probs[row, length:] == 0).all()
