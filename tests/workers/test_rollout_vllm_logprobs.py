"""The unfiltered log-prob patch (workers/rollout/vllm_logprobs.py) on the INSTALLED vLLM's own V1 and
V2 sampler classes, built here with tiny inputs (no engine, no GPU).

What every case checks: with top-p < 1 or top-k on, the log-prob vLLM would report for the sampled
token is log_softmax(logits / T)[token], and without the patch it is not (so the check has teeth).
V2's Triton kernels cannot run on a CPU: its temperature kernel and its Gumbel sampler are replaced
by torch stand-ins that do the same arithmetic; the filtering, the code the patch wraps and the
choice of which logits become "processed" are vLLM's own.
"""

import pytest
import torch

pytest.importorskip("vllm")

from logicrl.workers.rollout.vllm_logprobs import (  # noqa: E402
    VLLMInternalsChanged,
    patch_worker_sampler,
    report_unfiltered_logprobs,
)

pytestmark = pytest.mark.integration

V = 16  # vocabulary
# Row 0: nucleus 0.5 at T=0.7; row 1: top-k=1 at T=0.6 (logicrl's greedy-at-temperature request);
# row 2: top-k=3 and top-p=0.9 at T=1.3.
TEMPERATURES = [0.7, 0.6, 1.3]
TOP_P = [0.5, 1.0, 0.9]
TOP_K = [V, 1, 3]  # V = off, as vLLM stores it


def logits_for_test():
    g = torch.Generator().manual_seed(0)
    return torch.randn(len(TEMPERATURES), V, generator=g) * 3  # [b, V], peaked enough for top-p to cut


def expected_logprobs(logits):
    return (logits / torch.tensor(TEMPERATURES)[:, None]).log_softmax(-1)  # [b, V]: base.py's definition


# ---------------------------------------------------------------- V1 (CPU runner; V1 GPU runner)
def v1_metadata(b):
    from vllm.v1.sample.logits_processor import LogitsProcessors
    from vllm.v1.sample.metadata import SamplingMetadata

    return SamplingMetadata(
        temperature=torch.tensor(TEMPERATURES), all_greedy=False, all_random=True,
        top_p=torch.tensor(TOP_P), top_k=torch.tensor(TOP_K, dtype=torch.int32),
        generators={i: torch.Generator().manual_seed(i) for i in range(b)}, max_num_logprobs=0,
        no_penalties=True, prompt_token_ids=None, frequency_penalties=torch.zeros(b),
        presence_penalties=torch.zeros(b), repetition_penalties=torch.ones(b),
        output_token_ids=[[] for _ in range(b)], allowed_token_ids_mask=None, bad_words_token_ids={},
        logitsprocs=LogitsProcessors())


def v1_reported(patch: bool):
    """(sampled [b], reported log-prob of each sampled token [b]) from vLLM's V1 Sampler.forward."""
    from vllm.v1.sample.sampler import Sampler

    sampler = Sampler(logprobs_mode="processed_logprobs")
    if patch:
        assert report_unfiltered_logprobs(sampler) == "v1"
    logits = logits_for_test()
    out = sampler(logits.clone(), v1_metadata(len(logits)))
    # logprobs=0: column 0 of the gathered log-probs is the sampled token's.
    return out.sampled_token_ids[:, 0].long(), out.logprobs_tensors.logprobs[:, 0]


def test_v1_sampler_reports_tempered_unfiltered_logprobs():
    sampled, reported = v1_reported(patch=True)
    want = expected_logprobs(logits_for_test()).gather(-1, sampled[:, None])[:, 0]
    torch.testing.assert_close(reported, want, atol=1e-6, rtol=0)
    assert sampled[1] == logits_for_test()[1].argmax()  # top-k=1 still samples the argmax: sampling untouched


def test_v1_sampler_without_the_patch_reports_filtered_logprobs():
    sampled, reported = v1_reported(patch=False)
    want = expected_logprobs(logits_for_test()).gather(-1, sampled[:, None])[:, 0]
    assert reported[1] == 0.0  # top-k=1 renormalises onto one token: log 1
    assert (reported > want + 1e-3).all()  # renormalised over fewer tokens: every one is larger


# ---------------------------------------------------------------- V2 (Model Runner V2, the CUDA default)
@pytest.fixture
def v2_sampler(monkeypatch):
    """vLLM's V2 Sampler built on the CPU with three requests, its Triton kernels replaced by torch."""
    import vllm.v1.worker.gpu.buffer_utils as buffer_utils
    import vllm.v1.worker.gpu.sample.sampler as v2
    import vllm.v1.worker.gpu.sample.states as states
    from vllm import SamplingParams
    from vllm.config import VllmConfig
    from vllm.v1.worker.gpu.states import RequestState

    # No pinned memory without an accelerator: vLLM's own explicit-copy fallback buffers.
    monkeypatch.setattr(buffer_utils, "is_uva_available", lambda: False)

    def apply_temperature(logits, expanded_idx_mapping, temperature):  # _temperature_kernel
        t = temperature[expanded_idx_mapping]
        logits.div_(torch.where((t == 0) | (t == 1), 1.0, t)[:, None])

    def gumbel_sample(logits, expanded_idx_mapping, temperature, seed, pos, apply_temperature, **_):
        g = torch.Generator().manual_seed(0)  # Gumbel-max over the filtered logits (-inf never wins)
        u = torch.rand(logits.shape, generator=g).clamp_min(1e-12)
        return (logits - (-u.log()).log()).argmax(-1)

    monkeypatch.setattr(states, "apply_temperature", apply_temperature)
    monkeypatch.setattr(v2, "gumbel_sample", gumbel_sample)
    cpu = torch.device("cpu")
    b = len(TEMPERATURES)
    sampler = v2.Sampler(VllmConfig(), b, V, cpu, RequestState(b, 32, 64, 0, V, cpu),
                         logprobs_mode="processed_logprobs")
    for i in range(b):
        sampler.add_request(i, SamplingParams(temperature=TEMPERATURES[i], top_p=TOP_P[i],
                                              top_k=TOP_K[i] if TOP_K[i] < V else 0, seed=i, logprobs=0))
    sampler.apply_staged_writes()
    return sampler


def v2_reported(sampler):
    """What V2's __call__ reports in processed_logprobs mode: log_softmax of sample()'s processed logits."""
    import numpy as np

    b = len(TEMPERATURES)
    idx = torch.arange(b, dtype=torch.int32)
    sampled, processed = sampler.sample(
        logits_for_test(), idx, idx, np.arange(b), torch.zeros(b, dtype=torch.int64),
        torch.zeros(b, dtype=torch.int64), torch.zeros(b, dtype=torch.int32), np.full(b, 8), return_logprobs=True)
    return sampled, processed.log_softmax(-1).gather(-1, sampled[:, None])[:, 0]


def test_v2_sampler_reports_tempered_unfiltered_logprobs(v2_sampler):
    assert report_unfiltered_logprobs(v2_sampler) == "v2"
    sampled, reported = v2_reported(v2_sampler)
    want = expected_logprobs(logits_for_test()).gather(-1, sampled[:, None])[:, 0]
    torch.testing.assert_close(reported, want, atol=1e-6, rtol=0)
    assert sampled[1] == logits_for_test()[1].argmax()  # vLLM still filtered before sampling


def test_v2_sampler_without_the_patch_reports_filtered_logprobs(v2_sampler):
    sampled, reported = v2_reported(v2_sampler)
    want = expected_logprobs(logits_for_test()).gather(-1, sampled[:, None])[:, 0]
    assert reported[1] == 0.0  # unpatched, greedy-at-temperature reports log 1 for every token
    assert (reported > want + 1e-3).all()


def test_v2_unfiltered_requests_pass_through_untouched(v2_sampler):
    # No top-k/top-p anywhere in the batch: vLLM's processed logits are already right; no copy made.
    report_unfiltered_logprobs(v2_sampler)
    logits = logits_for_test()
    sampled, processed = v2_sampler._sample_random(logits, torch.arange(3), None, None, None, None, False)
    assert processed is logits


def test_patching_twice_does_not_nest(v2_sampler):
    report_unfiltered_logprobs(v2_sampler)
    wrapped = v2_sampler._sample_random
    assert report_unfiltered_logprobs(v2_sampler) == "v2"
    assert v2_sampler._sample_random is wrapped


# ---------------------------------------------------------------- when vLLM's internals move
class Worker:
    def __init__(self, sampler):
        self.model_runner = type("Runner", (), {"sampler": sampler})()


def test_a_sampler_without_either_hook_gets_one_clear_error():
    import vllm

    class Sampler:  # what a later vLLM might ship: a sampler with neither hook
        logprobs_mode = "processed_logprobs"

    with pytest.raises(VLLMInternalsChanged) as err:
        patch_worker_sampler(Worker(Sampler()))
    message = str(err.value)
    assert f"vLLM {vllm.__version__}" in message and "topk_topp_sampler" in message and "_sample_random" in message
    assert "\n" not in message


def test_a_v2_hook_with_other_arguments_gets_one_clear_error():
    class Sampler:
        logprobs_mode = "processed_logprobs"
        sampling_states = None

        def _sample_random(self, logits, params):  # renamed arguments
            return logits.argmax(-1), logits

    with pytest.raises(VLLMInternalsChanged, match=r"lacks the argument\(s\) processed_logits, top_k, top_p"):
        report_unfiltered_logprobs(Sampler())


def test_a_worker_without_a_sampler_and_a_wrong_mode_get_clear_errors():
    with pytest.raises(VLLMInternalsChanged, match="has no model_runner.sampler"):
        patch_worker_sampler(object())
    from vllm.v1.sample.sampler import Sampler

    with pytest.raises(VLLMInternalsChanged, match="expected 'processed_logprobs'"):
        report_unfiltered_logprobs(Sampler(logprobs_mode="raw_logprobs"))

