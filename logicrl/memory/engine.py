"""Each rollout engine's memory on one rank: its weights, its reserve and KV cache, asleep and awake.

    fp = footprint(x)                                   # the footprint config/engines.py's row of x.engine names
    weights, kv = fp.resident(x, engine, capacity, awake=False)

phases.py puts the trainer's state around these numbers. A footprint is anything with EngineFootprint's
members; a new engine writes one (here or in a module of its own) and names it in its row, or names one
of these where its memory behaves the same. Pure arithmetic, no torch: the preflight runs it.
"""

from __future__ import annotations

from typing import Protocol

from logicrl.config.engines import ENGINES, load
from logicrl.memory.footprint import (
    FP32,
    MIN_KV_CACHE_GB,
    ModelBytes,
    forward_transient_per_token,
    kv_bytes_per_token,
)
from logicrl.memory.planner_inputs import PlanInputs


class EngineFootprint(Protocol):
    # The KV cache is reserved when the engine starts, however few sequences run (vLLM): the plan notes how
    # many full-length sequences it holds and refuses one that holds none. False: it lives inside generate.
    preallocates_kv: bool

    def resident(self, x: PlanInputs, engine: ModelBytes, capacity: int, awake: bool) -> tuple[int, int]:
        """(the engine's weights with any reserve, its KV cache) on the device, between rollouts or awake."""
        ...

    def generating(self, x: PlanInputs) -> tuple[str, dict[str, int]]:
        """(the moment, the bytes by component beyond `resident` awake) at generate's peak."""
        ...

    def syncing(self, x: PlanInputs, engine: ModelBytes, capacity: int) -> tuple[int, int]:
        """(weights, KV cache) while a full weight sync streams into the engine."""
        ...

    def adapters_held(self, every: int, largest: int) -> int:
        """Bytes the adapter sync holds at once: `every` adapter, or the `largest` one at a time."""
        ...

    def kv_from_utilization(self, x: PlanInputs) -> bool:
        """Whether rollout.gpu_memory_utilization sizes the KV cache (a remedy for generate)."""
        ...


def footprint(x: PlanInputs) -> EngineFootprint:
    """The footprint of the engine `x` plans (x.engine: the one that runs, preflight/memory.py)."""
    return load(ENGINES[x.engine].footprint)


class PreallocatingFootprint:
    """vLLM: weights (1/tp each under tensor parallelism) and a KV cache reserved at start-up: a fraction of
    the device less the weights and its activation reserve (CUDA), rollout.kv_cache_gb, or on CPU room for
    max_num_seqs full sequences; it schedules its own batches inside that cache. The activation reserve is
    room, not tensors: vLLM frees its profiling forward, and a generate's forwards and sampler allocate
    and free theirs, so it is generate's transient alone (the closing memory table checks it on CPU:
    docs/memory.md, "Measured in a run"). Asleep on CUDA (its row's sleep_levels, rollout.free_cache_engine)
    it holds nothing on the device."""

    preallocates_kv = True

    def resident(self, x: PlanInputs, engine: ModelBytes, capacity: int, awake: bool) -> tuple[int, int]:
        if self._sleeps(x) and not awake:
            return 0, 0  # level 2 (weights and KV cache discarded) or 1 (weights on the host): rollout/vllm.py
        # With tensor parallelism vLLM keeps 1/tp of each sharded weight (vocab and norms are small next to the
        # linears); the KV cache default is unchanged: tp times the rows at 1/tp of the KV heads.
        weights = engine.total_full // x.rollout_tp
        if x.kv_cache_gb is not None:
            return weights, int(x.kv_cache_gb * 2**30)
        if x.device == "cuda":  # vLLM takes this fraction of the device; the KV cache is what is left
            return weights, max(0, int(x.gpu_memory_utilization * capacity) - weights - self._reserve(x))
        # engines.kv_cache_gb on CPU: room for max_num_seqs sequences at the configured full lengths, whatever
        # lengths the plan is for (the engine is built before any prompt is seen), at least MIN_KV_CACHE_GB.
        full = kv_bytes_per_token(x.spec, x.dtype_bytes) * x.gen_micro * x.worst_case().width
        return weights, max(int(MIN_KV_CACHE_GB * 2**30), full)

    def generating(self, x: PlanInputs) -> tuple[str, dict[str, int]]:
        return "largest forward", {"activations": self._reserve(x)}

    def syncing(self, x: PlanInputs, engine: ModelBytes, capacity: int) -> tuple[int, int]:
        weights, kv = self.resident(x, engine, capacity, awake=False)
        if self._sleeps(x) and 2 in ENGINES[x.engine].sleep_levels:
            # Level 2 discarded the weights: each TP member reloads its own 1/tp slice of every layer (the
            # full tensors stream past it), one layer's tensors held until the layer is complete.
            weights = (engine.total_full + engine.layer_full) // x.rollout_tp
        return weights, kv

    def adapters_held(self, every: int, largest: int) -> int:
        return every  # collected before the adapter is built on the host (rollout/vllm_lora.py)

    def kv_from_utilization(self, x: PlanInputs) -> bool:
        return x.device == "cuda" and x.kv_cache_gb is None

    @staticmethod
    def _reserve(x: PlanInputs) -> int:
        """vLLM sizes its activations by profiling one forward of max_num_batched_tokens tokens and the
        sampler's fp32 logits for max_num_seqs rows; this is an estimate of that profile."""
        return x.max_num_batched_tokens * forward_transient_per_token(x.spec, x.dtype_bytes, x.width) + \
            2 * FP32 * x.gen_micro * x.spec.vocab_size

    @staticmethod
    def _sleeps(x: PlanInputs) -> bool:
        return x.device == "cuda" and x.free_cache_engine and bool(ENGINES[x.engine].sleep_levels)


class DecodingFootprint:
    """hf: its weights always; the KV cache lives only inside generate, which decodes `gen_micro`
    sequences at a time (rollout/hf.py)."""

    preallocates_kv = False

    def resident(self, x: PlanInputs, engine: ModelBytes, capacity: int, awake: bool) -> tuple[int, int]:
        return engine.total_full, 0

    def generating(self, x: PlanInputs) -> tuple[str, dict[str, int]]:
        """A KV cache growing to the full width, grown by torch.cat one layer at a time (one layer's K or V
        twice for a moment); the prompt's prefill, whose RoPE cos and sin ([rows, P, head_dim] each, made once
        per forward) live through every layer; and per step either the attention's repeated K and V, or
        the sampler's [rows, V] buffers beside the model's own logits in its dtype: log-softmax, tempered
        logits, softmax and its cumsum (plus the fp32 upcast of the logits when the dtype is not fp32)."""
        b, rows = x.dtype_bytes, min(x.gen_micro, x.gen_rows)
        per_token = kv_bytes_per_token(x.spec, b)
        # The prefill runs beside the prompt's KV only; the sampler's buffers beside the full cache.
        prompt_cache = rows * x.prompt_len * per_token
        rope = 2 * b * x.spec.head_dim
        prefill = rows * x.prompt_len * (forward_transient_per_token(x.spec, b, x.prompt_len) + x.prompt_len + rope)
        cache = rows * x.width * per_token
        cache += cache // (2 * x.spec.num_layers)
        sampling = rows * x.spec.vocab_size * (4 * FP32 + b + (FP32 if b < FP32 else 0))
        # Each decode step's attention repeats one layer's cached K and V to every head (GQA with the
        # padding mask), the whole length long.
        spec = x.spec
        repeated = 2 * rows * x.width * spec.num_heads * spec.head_dim * b if spec.num_kv_heads < spec.num_heads else 0
        decode = max(sampling, repeated)
        if prompt_cache + prefill > cache + decode:
            return "prefill", {"kv_cache": prompt_cache, "activations": prefill}
        return "last decode step", {"kv_cache": cache, "activations": decode}

    def syncing(self, x: PlanInputs, engine: ModelBytes, capacity: int) -> tuple[int, int]:
        return self.resident(x, engine, capacity, awake=False)  # each tensor copied into its own in place

    def adapters_held(self, every: int, largest: int) -> int:
        return largest  # each copied into its own peft adapter as it arrives

    def kv_from_utilization(self, x: PlanInputs) -> bool:
        return False


VLLM = PreallocatingFootprint()
HF = DecodingFootprint()
