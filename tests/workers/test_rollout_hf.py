"""HFRolloutEngine: shapes and order, EOS masks, greedy/sampling semantics, and log-probs that the
trainer's chunked recomputation (models/logprob.py) reproduces."""

import pytest
import torch

from logicrl.models.logprob import causal_lm_logprobs
from logicrl.workers.rollout import RolloutEngine, SamplingParams
from logicrl.workers.rollout.hf import HFRolloutEngine, row_generators, sample_tokens
from tests.workers.conftest import (  # noqa: E402
    ask,
    assert_engine_logprobs_match,
    assert_stops_right_after_eos,
    generate,
    trainer_inputs,
)

PAD = 0
PROMPTS = [[17, 250, 3, 999], [5, 6, 7, 8, 9, 10, 11], [42]]  # different lengths: left padding is exercised
GREEDY = ask(n=2, do_sample=False, max_tokens=8)


def engine(model, eos_ids=(), micro_batch_size=8):
    return HFRolloutEngine(model, pad_id=PAD, eos_ids=list(eos_ids), micro_batch_size=micro_batch_size)


def trainer_batch(prompts, out):
    return trainer_inputs(prompts, out, PAD)


def test_engine_satisfies_the_protocol(tiny_qwen2):
    assert isinstance(engine(tiny_qwen2), RolloutEngine)


def test_shapes_and_prompt_major_order(tiny_qwen2):
    out = generate(engine(tiny_qwen2), PROMPTS, ask(n=2, max_tokens=6, seed=0))
    assert out.responses.shape == out.response_attention_mask.shape == out.response_mask.shape == \
        out.log_probs.shape == (6, 6)
    assert out.responses.dtype == torch.long and out.log_probs.dtype == torch.float32
    # Content follows the index: with greedy decoding rows 2i and 2i+1 are prompt i's answer alone.
    greedy = generate(engine(tiny_qwen2), PROMPTS, GREEDY)
    for i, prompt in enumerate(PROMPTS):
        alone = generate(engine(tiny_qwen2), [prompt], ask(do_sample=False, max_tokens=8))
        assert torch.equal(greedy.responses[2 * i], alone.responses[0])
        assert torch.equal(greedy.responses[2 * i + 1], alone.responses[0])


def test_left_padded_prompts_decode_as_if_alone(tiny_qwen2):
    batched = generate(engine(tiny_qwen2), PROMPTS, ask(do_sample=False, max_tokens=8))
    for i, prompt in enumerate(PROMPTS):
        alone = generate(engine(tiny_qwen2), [prompt], ask(do_sample=False, max_tokens=8))
        assert torch.equal(batched.responses[i], alone.responses[0])
        torch.testing.assert_close(batched.log_probs[i], alone.log_probs[0], atol=1e-5, rtol=1e-5)


def test_position_ids_count_real_tokens_only(tiny_qwen2):
    # RoPE only sees position differences, so a constant offset per row would not change any output;
    # the positions are checked directly to keep them what the trainer uses (and absolute-position
    # models need).
    calls = []
    handle = tiny_qwen2.register_forward_pre_hook(
        lambda module, args, kwargs: calls.append((kwargs["position_ids"].clone(), kwargs["attention_mask"].clone())),
        with_kwargs=True)
    generate(engine(tiny_qwen2), [[5, 6, 7], [8]], ask(do_sample=False, max_tokens=3))
    handle.remove()
    (prefill_pos, prefill_mask), *decode = calls
    assert prefill_pos.tolist() == [[0, 1, 2], [0, 0, 0]]  # the pad slots are masked out anyway
    assert prefill_mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert [pos.tolist() for pos, _ in decode] == [[[3], [1]], [[4], [2]]]
    assert decode[-1][1].tolist() == [[1, 1, 1, 1, 1], [0, 0, 1, 1, 1]]


def test_masks_stop_right_after_eos(tiny_qwen2):
    free = generate(engine(tiny_qwen2), PROMPTS, GREEDY)  # no EOS: every response runs to max_tokens
    assert free.response_attention_mask.all()
    eos = free.responses[0, 3].item()  # a token greedy decoding is known to emit, at step 3 or earlier
    out = generate(engine(tiny_qwen2, eos_ids=[eos]), PROMPTS, GREEDY)
    assert_stops_right_after_eos(free, out, eos, PAD, max_tokens=8)
    assert out.response_lengths[0] <= 4  # the stop really happened


def test_greedy_is_the_argmax_of_a_full_forward(tiny_qwen2):
    out = generate(engine(tiny_qwen2), PROMPTS, ask(do_sample=False, max_tokens=8))
    input_ids, attention_mask, position_ids = trainer_batch(PROMPTS, out)
    with torch.no_grad():
        logits = tiny_qwen2(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
    # Causal attention: the logits at P-1+t see exactly the prompt and the first t response tokens.
    width = input_ids.shape[1] - 8
    assert torch.equal(logits[:, width - 1:-1].argmax(-1), out.responses)


@pytest.mark.parametrize("params", [
    ask(n=2, temperature=0.7, top_p=0.9, top_k=50, max_tokens=10, seed=3),
    ask(n=2, temperature=1.3, max_tokens=10, seed=4),
    ask(n=1, temperature=0.0, max_tokens=10),  # greedy, scored at T=1
], ids=["filtered", "hot", "greedy"])
def test_engine_log_probs_equal_the_trainers_recomputation(tiny_qwen2, params):
    eos = generate(engine(tiny_qwen2), PROMPTS, GREEDY).responses[1, 2].item()  # makes lengths differ
    out = generate(engine(tiny_qwen2, eos_ids=[eos], micro_batch_size=4), PROMPTS, params)
    assert_engine_logprobs_match(tiny_qwen2, PROMPTS, out, params, PAD)


def test_same_seed_same_samples_other_seed_other_samples(tiny_qwen2):
    def sample(seed):
        return generate(engine(tiny_qwen2), PROMPTS, ask(n=2, max_tokens=8, seed=seed)).responses

    assert torch.equal(sample(7), sample(7))
    assert not torch.equal(sample(7), sample(8))


def test_top_k_one_is_greedy(tiny_qwen2):
    greedy = generate(engine(tiny_qwen2), PROMPTS, GREEDY)
    top1 = generate(engine(tiny_qwen2), PROMPTS, ask(n=2, temperature=1.0, top_k=1, max_tokens=8, seed=0))
    assert torch.equal(top1.responses, greedy.responses)


def test_micro_batch_size_does_not_change_sampled_output(tiny_qwen2):
    # Each row draws from its own seeded stream: an OOM retry with a smaller micro-batch
    # (workers/oom.py) must reproduce the same responses.
    params = ask(n=3, temperature=1.0, max_tokens=8, seed=11)
    small = generate(engine(tiny_qwen2, micro_batch_size=2), PROMPTS, params)
    large = generate(engine(tiny_qwen2, micro_batch_size=8), PROMPTS, params)
    assert torch.equal(small.responses, large.responses)
    torch.testing.assert_close(small.log_probs, large.log_probs)


def test_micro_batch_size_does_not_change_greedy_output(tiny_qwen2):
    small = generate(engine(tiny_qwen2, micro_batch_size=2), PROMPTS, GREEDY)
    large = generate(engine(tiny_qwen2, micro_batch_size=8), PROMPTS, GREEDY)
    assert torch.equal(small.responses, large.responses)
    torch.testing.assert_close(small.log_probs, large.log_probs, atol=1e-5, rtol=1e-5)


def test_eval_mode_during_generation_then_restored(make_tiny_qwen2):
    model = make_tiny_qwen2().train()
    seen = []
    handle = model.register_forward_pre_hook(lambda module, args: seen.append(module.training))
    generate(engine(model), [[1, 2, 3]], ask(max_tokens=3, seed=0))
    handle.remove()
    assert seen and not any(seen)
    assert all(m.training for m in model.modules())


def test_sync_weights_copies_a_streamed_state_and_sleep_wake_keep_it(make_tiny_qwen2):
    rollout_model, actor = make_tiny_qwen2(seed=0).eval(), make_tiny_qwen2(seed=1).eval()
    rollout = engine(rollout_model)
    before = generate(rollout, PROMPTS, GREEDY)
    want = generate(engine(actor), PROMPTS, GREEDY)
    assert not torch.equal(before.responses, want.responses)
    rollout.sleep()
    rollout.sync_weights(actor.named_parameters())  # a generator: one tensor at a time
    rollout.wake()
    after = generate(rollout, PROMPTS, GREEDY)
    assert torch.equal(after.responses, want.responses)
    torch.testing.assert_close(after.log_probs, want.log_probs, atol=0, rtol=0)
    with pytest.raises(KeyError, match="not_a_weight"):
        rollout.sync_weights([("not_a_weight", torch.zeros(1))])


# --- the sampler, on hand-built distributions ------------------------------------------------


def test_sampler_filters_but_reports_unfiltered_log_probs():
    probs = torch.tensor([0.5, 0.3, 0.1, 0.06, 0.04])
    logits = probs.log().repeat(4000, 1)  # [4000, 5]
    g = row_generators(0, range(4000), torch.device("cpu"))  # one per row, as the engine makes them

    # top_p=0.75: token 2 has 0.8 of mass before it, so only tokens 0 and 1 survive (5/8 vs 3/8).
    tokens, log_probs = sample_tokens(logits, SamplingParams(top_p=0.75), g)
    assert set(tokens.tolist()) == {0, 1}
    assert abs((tokens == 0).float().mean().item() - 0.625) < 0.03
    torch.testing.assert_close(log_probs, probs.log()[tokens])  # not renormalised over {0, 1}

    tokens, _ = sample_tokens(logits, SamplingParams(top_k=3), g)
    assert set(tokens.tolist()) == {0, 1, 2}

    # T=2 flattens: reported log-probs are log_softmax(logits / 2), the policy the trainer scores.
    tokens, log_probs = sample_tokens(logits, SamplingParams(temperature=2.0), g)
    torch.testing.assert_close(log_probs, torch.log_softmax(probs.log() / 2, -1)[tokens])
    assert abs((tokens == 4).float().mean().item() - torch.softmax(probs.log() / 2, -1)[4].item()) < 0.03


@pytest.mark.parametrize("bad, key", [(dict(top_p=0.0), "top_p"), (dict(top_k=0), "top_k"),
                                      (dict(temperature=-1.0), "temperature"), (dict(max_tokens=0), "max_tokens")])
def test_sampling_params_name_the_bad_key(bad, key):
    with pytest.raises(ValueError, match=key):
        SamplingParams(**bad)


def test_lora_actor_generates_and_agrees_with_the_trainer(make_tiny_qwen2):
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(make_tiny_qwen2().eval(),
                                peft.LoraConfig(r=4, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    params = ask(n=2, temperature=0.9, max_tokens=6, seed=0)
    out = generate(engine(model), PROMPTS, params)
    input_ids, attention_mask, position_ids = trainer_batch(PROMPTS, out)
    with torch.no_grad():
        recomputed, _ = causal_lm_logprobs(model, input_ids, attention_mask, position_ids, params.max_tokens,
                                           temperature=params.temperature)
    torch.testing.assert_close(out.log_probs, recomputed * out.response_mask, atol=1e-4, rtol=0)
