"""Adapter-only sync into vLLM on CPU (rollout/vllm_lora.py), in-process, without Ray: the engine is
built once with LoRA enabled; each sync hands it only the adapter tensors; greedy outputs stay the
trainer's argmax and log-probs the trainer's within the engine bound (1e-4) before and after several
syncs; a sync that did not take shows in rollout/logprob_diff. Fails when vLLM moves the internal the
in-memory load reaches (the worker manager's `_adapter_manager`)."""

import pytest
import torch

pytest.importorskip("vllm")

from logicrl.models.loading import LoraSpec, checkpoint_dir, load_causal_lm  # noqa: E402
from logicrl.models.logprob import causal_lm_logprobs  # noqa: E402
from logicrl.workers.actor import logprob_diff_metrics  # noqa: E402
from logicrl.workers.rollout.vllm import VLLMRolloutEngine  # noqa: E402
from logicrl.workers.weight_sync import iter_adapter_weights  # noqa: E402
from tests.workers.conftest import ask, assert_engine_logprobs_match, generate, trainer_inputs  # noqa: E402

pytestmark = pytest.mark.integration

PAD = 0
PROMPTS = [[17, 250, 3, 99], [5, 6, 7, 8, 9, 10, 11], [42]]
GREEDY = ask(n=1, do_sample=False, max_tokens=8)
SAMPLED = ask(n=2, temperature=0.9, top_p=0.9, max_tokens=8, seed=5)
# Rank 4 (vLLM rounds max_lora_rank up to 8); q and v but not k: the packed qkv_proj is partly adapted.
LORA = LoraSpec(rank=4, alpha=8, target_modules=["q_proj", "v_proj", "down_proj"])
BOUND = 1e-4  # the engine/trainer log-prob bound of every fp32 engine test (conftest)


@pytest.fixture(scope="module")
def engine():
    return VLLMRolloutEngine(str(checkpoint_dir("embedded:tiny")), pad_id=PAD, eos_ids=[], max_model_len=320,
                             kv_cache_gb=0.25, max_num_seqs=16, max_num_batched_tokens=512, seed=0, lora=LORA)


@pytest.fixture(scope="module")
def actor():
    """The trainer's policy: the tiny model under peft adapters (fp32 masters, as models/loading.py builds)."""
    return load_causal_lm("embedded:tiny", torch.float32, lora=LORA).eval()


def step(actor, seed: int) -> None:
    """An 'optimizer step': every adapter matrix moved (B too, so the adapter changes the outputs)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in actor.named_parameters():
            if ".lora_" in name:
                p.add_(0.3 * torch.randn(p.shape, generator=g))


def assert_engine_is_the_trainer(engine, actor):
    greedy = generate(engine, PROMPTS, GREEDY)
    input_ids, attention_mask, position_ids = trainer_inputs(PROMPTS, greedy, PAD)
    with torch.no_grad():
        logits = actor(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids).logits
    width = input_ids.shape[1] - GREEDY.max_tokens
    assert torch.equal(logits[:, width - 1:-1].argmax(-1), greedy.responses)  # greedy = the trainer's argmax
    for params in (GREEDY, SAMPLED):
        assert_engine_logprobs_match(actor, PROMPTS, generate(engine, PROMPTS, params), params, PAD)
    return greedy.responses


def test_adapter_syncs_keep_the_engine_equal_to_the_trainer(engine, actor):
    assert engine.lora_request is None
    base = assert_engine_is_the_trainer(engine, actor)  # peft's B starts at 0: the base alone
    seen = [base]
    for i in range(1, 4):
        step(actor, seed=i)
        stats: dict = {}
        held = engine.sync_adapters(iter_adapter_weights(actor, torch.float32, stats))
        assert held == [i] and engine.lora_request.lora_int_id == i  # the old adapter evicted: one held
        # Only the adapters moved: 2 layers x 3 targets x (A [4, in] + B [out, 4]), fp32.
        assert stats["tensors"] == 12
        assert stats["bytes"] == sum(p.numel() * 4 for n, p in actor.named_parameters() if ".lora_" in n)
        seen.append(assert_engine_is_the_trainer(engine, actor))
    assert not torch.equal(seen[0], seen[-1])  # the adapters changed what is generated


def logprob_diff(engine, model) -> dict[str, float]:
    """rollout/logprob_diff(_max) as a run reports it: the engine's sampled log-probs against `model`'s."""
    out = generate(engine, PROMPTS, SAMPLED)
    input_ids, attention_mask, position_ids = trainer_inputs(PROMPTS, out, PAD)
    with torch.no_grad():
        lp, _ = causal_lm_logprobs(model, input_ids, attention_mask, position_ids, SAMPLED.max_tokens,
                                   temperature=SAMPLED.logprob_temperature, chunk_tokens=16)
    return logprob_diff_metrics(lp, {"response_mask": out.response_mask, "rollout_log_probs": out.log_probs})


def test_a_sync_that_did_not_take_shows_in_logprob_diff(engine, actor):
    engine.sync_adapters(iter_adapter_weights(actor, torch.float32))
    assert logprob_diff(engine, actor)["rollout/logprob_diff_max"] < BOUND  # in sync
    step(actor, seed=99)  # the trainer moves on; the injected fault: no sync_adapters call
    # The stale adapter is far outside the bound the run's tests assert.
    assert logprob_diff(engine, actor)["rollout/logprob_diff_max"] > 100 * BOUND


def test_sync_adapters_refuses_an_engine_built_without_lora(engine, monkeypatch):
    monkeypatch.setattr(engine, "lora", None)
    with pytest.raises(RuntimeError, match="built without LoRA"):
        engine.sync_adapters([])


def test_the_engine_never_writes_into_the_trainers_adapters(engine, actor):
    # vLLM folds the scale into lora_B in place: handed the parameter itself, it rescaled the trainer's
    # (found on one FSDP2 rank, where full_tensor() is a view of the shard). iter_adapter_weights copies.
    before = {n: p.detach().clone() for n, p in actor.named_parameters() if ".lora_" in n}
    engine.sync_adapters(iter_adapter_weights(actor))  # no dtype: nothing to cast, the aliasing case
    assert all(torch.equal(p, before[n]) for n, p in actor.named_parameters() if ".lora_" in n)



def test_over_an_nf4_base_the_base_goes_once_then_only_adapters(engine, actor):
    """QLoRA with the adapter sync (docs/quantization.md): the engine loaded the checkpoint's own weights;
    it takes the dequantized 4-bit base once, then each sync is the adapters alone, and stays the trainer."""
    pytest.importorskip("torchao")
    from logicrl.models.loading import QuantSpec
    from logicrl.workers.weight_sync import iter_engine_weights
    from tests.helpers.worker import ADAPTER_BYTES, BASE_BYTES

    qlora = load_causal_lm("embedded:tiny", torch.float32, lora=LORA, quant=QuantSpec("nf4", 64, 256)).eval()
    try:
        step(qlora, seed=1)
        engine.sync_adapters(iter_adapter_weights(qlora, torch.float32))
        # Adapters alone over the checkpoint's own base: the 4-bit round trip is missing (what lora_sync
        # was forced to merged for), far outside the bound.
        assert logprob_diff(engine, qlora)["rollout/logprob_diff"] > 100 * BOUND
        base: dict = {}
        engine.sync_weights(iter_engine_weights(qlora, None, base, dtype=torch.float32, merge_lora=False))
        assert base["bytes"] == BASE_BYTES and engine.lora_request is None  # vLLM's reload dropped the adapter
        for i in range(2, 5):
            stats: dict = {}
            engine.sync_adapters(iter_adapter_weights(qlora, torch.float32, stats))
            assert stats["bytes"] == ADAPTER_BYTES  # the base is never re-sent
            assert_engine_is_the_trainer(engine, qlora)  # greedy = argmax, log-probs within the merged bound
            step(qlora, seed=i)
        # A sync that did not take (the last step above was never sent) is caught over the 4-bit base too.
        assert logprob_diff(engine, qlora)["rollout/logprob_diff_max"] > 100 * BOUND
    finally:  # the module's engine goes back to the checkpoint's base for the tests after this one
        engine.sync_weights(iter_engine_weights(actor, None, dtype=torch.float32, merge_lora=False))
        engine.sync_adapters(iter_adapter_weights(actor, torch.float32))
