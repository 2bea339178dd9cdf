"""A tiny random Qwen2 (the embedded model's shape), built offline with a fixed seed."""

from dataclasses import dataclass

import pytest
import torch
import transformers

from logicrl.models.loading import checkpoint_dir, load_causal_lm
from logicrl.workers.rollout import SamplingParams


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


@dataclass(frozen=True)
class Ask:
    """What a test asks an engine for: sampling parameters, and each prompt repeated n times
    (the controller's job in training, trainer/batch.py). Reads through to the parameters."""

    n: int
    params: SamplingParams

    def __getattr__(self, name):
        return getattr(self.params, name)


def ask(n: int = 1, **params) -> Ask:
    return Ask(n, SamplingParams(**params))


def left_padded(prompts, n: int = 1, pad_id: int = 0):
    """Token lists -> left-padded input_ids, attention_mask [len(prompts) * n, P], prompt-major."""
    rows = [p for p in prompts for _ in range(n)]
    width = max(map(len, rows))
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, row in enumerate(rows):
        ids[i, width - len(row):] = torch.tensor(row)
        mask[i, width - len(row):] = 1
    return ids, mask


def generate(engine, prompts, asked, pad_id: int = 0, **kwargs):
    asked = asked if isinstance(asked, Ask) else Ask(1, asked)
    return engine.generate(*left_padded(prompts, asked.n, pad_id), asked.params, **kwargs)


def trainer_inputs(prompts, out, pad_id):
    """The trainer's view of a rollout (workers/hybrid.py's generate): [N, P+R] ids, mask, positions."""
    ids, mask = left_padded(prompts, out.responses.shape[0] // len(prompts), pad_id)
    attention_mask = torch.cat([mask, out.response_attention_mask.long()], dim=1)
    return torch.cat([ids, out.responses], dim=1), attention_mask, (attention_mask.cumsum(-1) - 1).clamp(min=0)


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
    eos: both masks cover up to and including it, the rest is pad with log-prob 0."""
    for row in range(free.responses.shape[0]):
        hits = (free.responses[row] == eos).nonzero()
        length = hits[0].item() + 1 if len(hits) else max_tokens  # up to and including the first EOS
        assert out.response_attention_mask[row].tolist() == [1] * length + [0] * (max_tokens - length)
        assert torch.equal(out.response_mask[row], out.response_attention_mask[row])  # one turn: all trained
        assert out.response_lengths[row] == length
        assert torch.equal(out.responses[row, :length], free.responses[row, :length])
        assert (out.responses[row, length:] == pad_id).all()
        assert (out.log_probs[row, length:] == 0).all()


# A chat template unlike the tiny tokenizer's ChatML: the same vocabulary under it is another tokenizer
# to the reward model's phase (models/rm_inputs.py same_tokenizer), so rows are re-rendered.
PLAIN_TEMPLATE = "{%- for m in messages %}{{- m['role'] + ': ' + m['content'] + '\n' }}{%- endfor %}"


def write_tiny_reward_model(path, seed: int = 0, chat_template: str | None = None):
    """A random one-label Qwen2ForSequenceClassification (hidden 64, one 64-wide head) over the embedded
    tiny tokenizer, saved with that tokenizer (under `chat_template`, if given) as a checkpoint at `path`."""
    from logicrl.models.loading import load_tokenizer

    tokenizer = load_tokenizer("embedded:tiny", quiet=True)
    torch.manual_seed(seed)
    config = transformers.Qwen2Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=1,
                                      num_key_value_heads=1, head_dim=64, intermediate_size=128, vocab_size=2048,
                                      max_position_embeddings=8192, pad_token_id=tokenizer.pad_token_id, num_labels=1)
    model = transformers.AutoModelForSequenceClassification.from_config(config)
    with torch.no_grad():
        model.score.weight.mul_(50)  # a random head scores near 0 everywhere: make rows differ visibly
    model.save_pretrained(path)
    if chat_template is not None:
        tokenizer.chat_template = chat_template
    tokenizer.save_pretrained(path)
    return path


def leave_group(meet: bool = True) -> None:
    """End a spawned gloo rank: meet the other ranks (unless `meet` is False: a test that broke the
    group on purpose, where a peer may be gone), then exit at once.

    Tearing gloo down (destroy_process_group, or the interpreter's exit) aborted a rank now and then
    on 2 busy cores ("terminate called without an active exception", SIGABRT), failing a test whose
    work was already done and saved. After the barrier no collective is in flight, and os._exit runs
    no C++ destructors: the rank's exit code is 0, which is all mp.spawn reads.
    """
    import os
    import sys

    if meet:
        torch.distributed.barrier()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def perturbed_copy(seed=0):
    """The embedded tiny actor (fp32) with every weight moved by 0.1 of its std: weights an engine must be
    synced to."""
    actor = load_causal_lm(str(checkpoint_dir("embedded:tiny")), torch.float32).eval()
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for param in actor.parameters():
            param.add_(0.1 * param.std() * torch.randn(param.shape, generator=g))
    return actor
