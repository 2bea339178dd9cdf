"""Make vLLM's sampler report log_softmax(logits / T) BEFORE top-k/top-p filtering (base.py's definition).

vLLM 0.32's logprobs_mode offers raw (no temperature) or processed (after temperature and top-k/top-p,
renormalised over the kept tokens): neither is right once a filter is on. The engine runs in processed
mode, and this module wraps, on the sampler instance inside vLLM's worker, the one step that filters,
so what it hands on is tempered and unfiltered; which tokens are drawn is untouched.
- V1 (`vllm/v1/sample/sampler.py`: the CPU runner and the V1 GPU runner): wrap `topk_topp_sampler`,
  take the log-softmax of what it receives, and set vLLM's own mode to raw so it skips a second one.
- V2 (Model Runner V2, the CUDA default: `vllm/v1/worker/gpu/sample/sampler.py`): wrap `_sample_random`,
  returning a copy of the tempered logits in place of the filtered ones.
Cost: one [b, V] fp32 tensor per decode step; samplers run outside CUDA graphs, so a wrapper applies.
A renamed hook raises one VLLMInternalsChanged naming the installed vLLM (docs/engines.md).
"""

from __future__ import annotations

import inspect

import torch

PATCHED = "_logicrl_unfiltered_logprobs"  # set on a sampler once patched: patching twice would nest
V2_HOOK_ARGS = ("processed_logits", "top_k", "top_p", "use_fused_sampler")


class VLLMInternalsChanged(RuntimeError):
    """vLLM's sampler no longer has the hook this module patches: the pinned vLLM is not installed."""


def vllm_version() -> str:
    try:
        import vllm

        return vllm.__version__
    except Exception:  # a broken install still deserves the clear message
        return "unknown"


def _changed(what: str) -> VLLMInternalsChanged:
    return VLLMInternalsChanged(
        f"vLLM {vllm_version()}: {what}; logicrl's unfiltered log-prob patch (workers/rollout/vllm_logprobs.py) "
        "is written for vLLM 0.32's V1 and V2 samplers: install vllm==0.32.0 (pyproject.toml) or use "
        "actor_rollout_ref.rollout.name=hf")


def report_unfiltered_logprobs(sampler) -> str:
    """Patch a V1 or V2 sampler instance in place; returns which one it was ("v1" or "v2")."""
    if getattr(sampler, PATCHED, None):
        return getattr(sampler, PATCHED)
    if getattr(sampler, "logprobs_mode", None) != "processed_logprobs":
        raise _changed(f"{type(sampler).__name__}.logprobs_mode is {getattr(sampler, 'logprobs_mode', None)!r}, "
                       "expected 'processed_logprobs' (set by VLLMRolloutEngine)")
    if hasattr(sampler, "topk_topp_sampler"):
        kind = _patch_v1(sampler)
    elif hasattr(sampler, "_sample_random") and hasattr(sampler, "sampling_states"):
        kind = _patch_v2(sampler)
    else:
        raise _changed(f"the sampler {type(sampler).__module__}.{type(sampler).__name__} has neither "
                       "`topk_topp_sampler` (V1) nor `_sample_random` and `sampling_states` (V2)")
    setattr(sampler, PATCHED, kind)
    return kind


def _patch_v1(sampler) -> str:
    topk_topp = sampler.topk_topp_sampler
    vllm_forward = getattr(topk_topp, "forward", None)
    if vllm_forward is None or not hasattr(topk_topp, "logprobs_mode"):
        raise _changed(f"{type(topk_topp).__name__} has no `forward` or `logprobs_mode`")
    topk_topp.logprobs_mode = "raw_logprobs"  # only read by that inner forward: skip its log-softmax

    def forward(logits, generators, k, p):
        log_probs = logits.log_softmax(dim=-1, dtype=torch.float32)  # [b, V], tempered, before filtering
        sampled, _ = vllm_forward(logits, generators, k, p)  # may filter `logits` in place
        return sampled, log_probs

    topk_topp.forward = forward  # nn.Module.__call__ finds the instance attribute first
    return "v1"


def _patch_v2(sampler) -> str:
    if getattr(sampler, "return_sampling_mask", False):
        # The sampling mask is built from the filtered logits this patch replaces.
        raise _changed("the V2 sampler has return_sampling_mask on, which needs the filtered logits")
    vllm_sample_random = sampler._sample_random
    signature = inspect.signature(vllm_sample_random)
    missing = [name for name in V2_HOOK_ARGS if name not in signature.parameters]
    if missing:
        raise _changed(f"the V2 Sampler._sample_random{signature} lacks the argument(s) {', '.join(missing)}")

    def _sample_random(*args, **kwargs):
        bound = signature.bind(*args, **kwargs)
        a = bound.arguments
        if a["use_fused_sampler"] or (a["top_k"] is None and a["top_p"] is None):
            return vllm_sample_random(*args, **kwargs)  # fused: no log-probs asked; unfiltered: already right
        unfiltered = a["processed_logits"].clone()  # [b, V] tempered; vLLM may filter the original in place
        sampled, _ = vllm_sample_random(*args, **kwargs)
        return sampled, unfiltered

    sampler._sample_random = _sample_random  # `self._sample_random(...)` finds the instance attribute first
    return "v2"


def patch_worker_sampler(worker) -> str:
    """collective_rpc target, run inside vLLM's worker after the model (and its sampler) is loaded."""
    runner = getattr(worker, "model_runner", None)
    sampler = getattr(runner, "sampler", None)
    if sampler is None:
        raise _changed(f"{type(worker).__name__} has no model_runner.sampler")
    return report_unfiltered_logprobs(sampler)
