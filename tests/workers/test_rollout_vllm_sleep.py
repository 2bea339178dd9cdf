"""VLLMRolloutEngine's CUDA-only logic, on the CPU, with vllm.LLM replaced by a recorder: sleep level 2
and the weights_valid flag, the enforce_eager default, and HybridWorker re-syncing before it generates
from discarded weights (a critic warm-up step skips update_weights). What is checked is logicrl's
logic, not vLLM: which calls reach the engine, in which order, and what generate() refuses."""

from types import SimpleNamespace

import pytest
import torch

vllm = pytest.importorskip("vllm")

from vllm.logprobs import FlatLogprobs  # noqa: E402

from logicrl.workers.rollout import SamplingParams  # noqa: E402
from logicrl.workers.rollout.vllm import VLLMRolloutEngine, WeightsDiscarded  # noqa: E402

pytestmark = pytest.mark.integration

TOKENS = [5, 6, 7]
LOGPROBS = [-0.25, -1.5, -3.0]


class FakeLLM:
    """Records what the engine asks of vllm.LLM; generates TOKENS with LOGPROBS for every prompt."""

    def __init__(self, **kwargs):
        self.kwargs, self.calls = kwargs, []

    def collective_rpc(self, method, args=()):
        self.calls.append(("rpc", method.__name__))
        return ["v2"]

    def sleep(self, level):
        self.calls.append(("sleep", level))

    def wake_up(self, tags=None):
        self.calls.append(("wake_up", tags))

    def reset_prefix_cache(self):
        self.calls.append(("reset_prefix_cache",))

    def generate(self, prompts, params, use_tqdm, lora_request=None):
        assert all(p.flat_logprobs and p.logprobs == 0 for p in params)
        self.calls.append(("generate", len(prompts)))
        flat = FlatLogprobs()
        for token, logprob in zip(TOKENS, LOGPROBS):
            flat.append({token: vllm.logprobs.Logprob(logprob)})
        return [SimpleNamespace(outputs=[SimpleNamespace(token_ids=TOKENS, logprobs=flat)]) for _ in prompts]


def build(monkeypatch, cuda: bool, **kwargs):
    monkeypatch.setattr(vllm, "LLM", FakeLLM)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    return VLLMRolloutEngine("unused", pad_id=0, eos_ids=[], max_model_len=64, **kwargs)


PROMPTS = (torch.tensor([[0, 3, 4], [8, 9, 10]]), torch.tensor([[0, 1, 1], [1, 1, 1]]))
PARAMS = SamplingParams(max_tokens=4, seed=1)


def test_cuda_sleeps_at_level_2_and_refuses_to_generate_until_synced(monkeypatch):
    engine = build(monkeypatch, cuda=True)
    llm = engine.llm
    assert llm.kwargs["enable_sleep_mode"] and engine.sampler_kind == "v2"
    engine.generate(*PROMPTS, PARAMS)
    engine.sleep()
    assert llm.calls[-1] == ("sleep", 2) and not engine.weights_valid
    llm.calls.clear()
    with pytest.raises(WeightsDiscarded, match="level-2 sleep with no sync_weights since"):
        engine.generate(*PROMPTS, PARAMS)
    assert llm.calls == []  # refused before waking anything or generating
    engine.wake()  # waking maps memory back; it does not make the weights valid
    with pytest.raises(WeightsDiscarded):
        engine.generate(*PROMPTS, PARAMS)


def test_sync_wakes_the_weights_only_then_generate_wakes_the_rest(monkeypatch):
    engine = build(monkeypatch, cuda=True)
    engine.sleep()
    engine.llm.calls.clear()
    engine.sync_weights(iter([("w", torch.zeros(1))]))
    assert engine.weights_valid
    engine.generate(*PROMPTS, PARAMS)
    assert engine.llm.calls == [("wake_up", ["weights"]), ("rpc", "_reload_weights"), ("reset_prefix_cache",),
                                ("wake_up", None), ("generate", 2)]


def test_cpu_sleep_keeps_the_weights_and_only_drops_the_prefix_cache(monkeypatch):
    engine = build(monkeypatch, cuda=False)
    assert not engine.llm.kwargs["enable_sleep_mode"]
    engine.sleep()
    assert engine.llm.calls[-1] == ("reset_prefix_cache",) and engine.weights_valid
    out = engine.generate(*PROMPTS, PARAMS)  # no sync needed
    assert not any(call[0] in ("sleep", "wake_up") for call in engine.llm.calls)
    # The flat log-probs land in each row, 0 where masked.
    torch.testing.assert_close(out.log_probs, torch.tensor([LOGPROBS + [0.0]] * 2))
    assert out.response_attention_mask.tolist() == out.response_mask.tolist() == [[1, 1, 1, 0]] * 2


def test_free_cache_engine_off_never_sleeps(monkeypatch):
    engine = build(monkeypatch, cuda=True, free_cache_engine=False)
    engine.sleep()
    assert not engine.llm.kwargs["enable_sleep_mode"] and engine.weights_valid and engine.llm.calls == [
        ("rpc", "patch_worker_sampler")]


@pytest.mark.parametrize("cuda, asked, eager", [(False, None, True), (True, None, False), (True, True, True),
                                                (False, False, False)])
def test_enforce_eager_defaults_to_eager_on_cpu_and_graphs_on_cuda(monkeypatch, cuda, asked, eager):
    engine = build(monkeypatch, cuda=cuda, enforce_eager=asked)
    assert engine.llm.kwargs["enforce_eager"] is eager and engine.enforce_eager is eager


def test_hybrid_worker_resyncs_before_generating_from_discarded_weights(monkeypatch):
    # A critic warm-up step ran no update_weights after the previous generate's level-2 sleep.
    from tensordict import TensorDict

    from logicrl.workers.hybrid import HybridWorker

    engine = build(monkeypatch, cuda=True)
    engine.sleep()
    synced = []

    def update_weights(_batch, _retry):
        synced.append(True)
        engine.sync_weights(iter([]))

    worker = SimpleNamespace(engine=engine, rank=0, device=torch.device("cpu"), _update_weights=update_weights,
                             cfg=SimpleNamespace(actor_rollout_ref=SimpleNamespace(
                                 rollout=SimpleNamespace(free_cache_engine=True))))
    batch = TensorDict({"input_ids": PROMPTS[0], "attention_mask": PROMPTS[1]}, batch_size=[2])
    out, _ = HybridWorker._generate(worker, batch, None, {"max_tokens": 4, "seed": 1})
    assert synced == [True] and out["responses"][:, :3].tolist() == [TOKENS] * 2
    assert not engine.weights_valid  # it slept again after generating: the next step's sync is due
    HybridWorker._generate(worker, batch, None, {"max_tokens": 4, "seed": 1})
    assert synced == [True, True]
