"""VLLMRolloutEngine on CPU: shapes and order, EOS masks, greedy determinism, and log-probs that the
trainer's recomputation (models/logprob.py) reproduces with the HF model on the same weights, before
and after a weight sync. One engine per module: starting vLLM costs several seconds."""

import pytest
import torch

pytest.importorskip("vllm")

from logicrl.models.loading import checkpoint_dir, load_causal_lm  # noqa: E402
from logicrl.models.logprob import causal_lm_logprobs  # noqa: E402
from logicrl.workers.rollout import RolloutEngine  # noqa: E402
from logicrl.workers.rollout.vllm import VLLMRolloutEngine, sampled_logprobs  # noqa: E402
from tests.workers.conftest import (  # noqa: E402
    ask,
    assert_engine_logprobs_match,
    assert_stops_right_after_eos,
    generate,
    perturbed_copy,
    trainer_inputs,
)

pytestmark = pytest.mark.integration

PAD = 0
PROMPTS = [[17, 250, 3, 99], [5, 6, 7, 8, 9, 10, 11], [42]]  # different lengths
GREEDY = ask(n=2, do_sample=False, max_tokens=8)


@pytest.fixture(scope="module")
def model_dir():
    return checkpoint_dir("embedded:tiny")


@pytest.fixture(scope="module")
def engine(model_dir):
    return VLLMRolloutEngine(str(model_dir), pad_id=PAD, eos_ids=[], max_model_len=320, kv_cache_gb=0.25,
                             max_num_seqs=16, max_num_batched_tokens=512, seed=0)


@pytest.fixture(scope="module")
def hf_model(model_dir):
    return load_causal_lm(str(model_dir), torch.float32).eval()


@pytest.fixture
def synced(engine, hf_model):
    """Lets a test sync other weights into the shared engine, and puts the original ones back."""
    yield engine
    engine.sync_weights(hf_model.named_parameters())


def trainer_batch(prompts, out):
    return trainer_inputs(prompts, out, PAD)


def assert_trainer_agrees(model, out, params):
    assert_engine_logprobs_match(model, PROMPTS, out, params, PAD)


def test_engine_satisfies_the_protocol(engine):
    assert isinstance(engine, RolloutEngine)


def test_shapes_masks_and_prompt_major_order(engine):
    out = generate(engine, PROMPTS, ask(n=2, max_tokens=6, seed=0))
    assert out.responses.shape == out.response_attention_mask.shape == out.response_mask.shape == \
        out.log_probs.shape == (6, 6)
    assert out.responses.dtype == torch.long and out.log_probs.dtype == torch.float32
    assert out.response_attention_mask.all()  # no EOS configured: every response runs to max_tokens
    # Content follows the index: greedy rows 2i and 2i+1 are prompt i's answer alone.
    greedy = generate(engine, PROMPTS, GREEDY)
    for i, prompt in enumerate(PROMPTS):
        alone = generate(engine, [prompt], ask(do_sample=False, max_tokens=8))
        assert torch.equal(greedy.responses[2 * i], alone.responses[0])
        assert torch.equal(greedy.responses[2 * i + 1], alone.responses[0])


def test_masks_stop_right_after_eos(engine, monkeypatch):
    free = generate(engine, PROMPTS, GREEDY)
    eos = free.responses[0, 3].item()  # a token greedy decoding is known to emit, at step 3 or earlier
    monkeypatch.setattr(engine, "eos_ids", [eos])
    out = generate(engine, PROMPTS, GREEDY)
    assert_stops_right_after_eos(free, out, eos, PAD, max_tokens=8)
    assert out.response_lengths[0] <= 4  # the stop really happened


def test_greedy_is_deterministic_and_the_hf_argmax(engine, hf_model):
    first, second = generate(engine, PROMPTS, GREEDY), generate(engine, PROMPTS, GREEDY)
    assert torch.equal(first.responses, second.responses)
    torch.testing.assert_close(first.log_probs, second.log_probs, atol=0, rtol=0)
    input_ids, attention_mask, position_ids = trainer_batch(PROMPTS, first)
    with torch.no_grad():
        logits = hf_model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
    width = input_ids.shape[1] - 8
    assert torch.equal(logits[:, width - 1:-1].argmax(-1), first.responses)


def test_same_seed_same_samples_other_seed_other_samples(engine):
    def sample(seed):
        return generate(engine, PROMPTS, ask(n=2, max_tokens=8, seed=seed)).responses

    assert torch.equal(sample(7), sample(7))
    assert not torch.equal(sample(7), sample(8))


def test_seeded_batch_beyond_one_steps_token_budget(engine):
    # 6 x 100 prompt tokens > max_num_batched_tokens=512. With chunked prefill a seeded request
    # split over two steps made vLLM's CPU runner rewind a CPU generator and raise (vllm.py, point 3).
    prompts = [[(5 * i + j) % 700 + 3 for j in range(100)] for i in range(6)]
    params = ask(n=2, max_tokens=4, seed=11)
    first = generate(engine, prompts, params)
    assert torch.equal(first.responses, generate(engine, prompts, params).responses)


PARAMS = [
    ask(n=2, temperature=0.7, top_p=0.9, top_k=50, max_tokens=10, seed=3),
    ask(n=2, temperature=1.3, max_tokens=10, seed=4),
    ask(n=1, temperature=0.0, max_tokens=10),  # greedy, scored at T=1
    ask(n=1, temperature=0.6, do_sample=False, max_tokens=10),  # greedy, scored at T=0.6
]
PARAM_IDS = ["filtered", "hot", "greedy", "greedy-tempered"]


@pytest.mark.parametrize("params", PARAMS, ids=PARAM_IDS)
def test_engine_log_probs_equal_the_trainers_recomputation(engine, hf_model, params):
    # "filtered" is the case vLLM's own logprobs modes get wrong (processed_logprobs renormalises
    # over the kept tokens, raw_logprobs ignores the temperature).
    assert_trainer_agrees(hf_model, generate(engine, PROMPTS, params), params)


def test_flat_logprobs_read_as_one_tensor_equal_the_per_token_dicts(engine):
    # The same seeded requests, once as the engine asks (flat_logprobs) and once with vLLM's default
    # list of one {token: Logprob} dict per position, read the old way.
    from vllm.inputs import TokensPrompt

    prompts = [TokensPrompt(prompt_token_ids=p) for p in PROMPTS]
    flat_params = [engine._vllm_params(PARAMS[0].params, seed) for seed in (1, 2, 3)]
    dict_params = [p.clone() for p in flat_params]
    for p in dict_params:
        p.flat_logprobs = False
    flat = [r.outputs[0] for r in engine.llm.generate(prompts, flat_params, use_tqdm=False)]
    dicts = [r.outputs[0] for r in engine.llm.generate(prompts, dict_params, use_tqdm=False)]
    for f, d in zip(flat, dicts, strict=True):
        tokens = list(d.token_ids)
        assert list(f.token_ids) == tokens and len(tokens) == PARAMS[0].max_tokens
        assert isinstance(d.logprobs, list) and not isinstance(f.logprobs, list)
        old = torch.tensor([step[t].logprob for step, t in zip(d.logprobs, tokens, strict=True)])
        assert torch.equal(sampled_logprobs(f.logprobs, tokens), old)
    with pytest.raises(RuntimeError, match="expected exactly the sampled token at each position"):
        sampled_logprobs(flat[0].logprobs, list(flat[1].token_ids))


def test_log_probs_agree_after_syncing_perturbed_weights(synced, hf_model):
    actor = perturbed_copy()
    before = generate(synced, PROMPTS, GREEDY)
    synced.sleep()
    synced.sync_weights(actor.named_parameters())  # a generator: one tensor at a time
    synced.wake()
    for params in PARAMS:
        out = generate(synced, PROMPTS, params)  # same prompts: the prefix cache must not serve old KV
        assert_trainer_agrees(actor, out, params)
    assert not torch.equal(generate(synced, PROMPTS, GREEDY).responses, before.responses)


def test_a_sync_that_makes_one_token_dominate_changes_what_is_generated(synced, hf_model):
    token = 700
    before = generate(synced, PROMPTS, GREEDY)
    assert (before.responses == token).float().mean() < 0.2
    # Tied embeddings: lm_head row `token` is its embedding row. Aligned with the mean final hidden
    # state and scaled up, its logit beats every other token at every position.
    with torch.no_grad():
        hidden = hf_model.model(input_ids=torch.tensor([PROMPTS[1]])).last_hidden_state[0]  # [P, H]
    direction = hidden.mean(0) / hidden.mean(0).norm()
    embed = hf_model.get_input_embeddings().weight
    new_embed = embed.detach().clone()
    new_embed[token] = 50 * direction
    synced.sync_weights((name, new_embed if name == "model.embed_tokens.weight" else p)
                        for name, p in hf_model.named_parameters())
    after = generate(synced, PROMPTS, GREEDY)
    assert (after.responses == token).float().mean() > 0.9


def test_sync_drops_prefix_cache_computed_with_old_weights(synced):
    # CPU blocks hold 128 tokens and only full blocks are cached, so the prompt spans two.
    long_prompt = [[(7 * i) % 700 + 3 for i in range(260)]]
    params = ask(do_sample=False, max_tokens=8)
    generate(synced, long_prompt, params)  # fills the prefix cache with the old weights' KV
    actor = perturbed_copy(seed=1)
    synced.sync_weights(actor.named_parameters())
    out = generate(synced, long_prompt, params)
    ids = torch.cat([torch.tensor(long_prompt), out.responses], dim=1)  # [1, P+R]
    with torch.no_grad():
        recomputed, _ = causal_lm_logprobs(actor, ids, torch.ones_like(ids), torch.arange(ids.shape[1])[None], 8)
    torch.testing.assert_close(out.log_probs, recomputed, atol=1e-4, rtol=0)
