"""Rollout with vLLM, created once per rank, in this process, beside the actor (the hybrid engine).

In-process (VLLM_ENABLE_V1_MULTIPROCESSING=0, executor "uni"; "external_launcher" under tensor
parallelism, vllm_tp.py), so weight sync hands tensors over by reference. Where vLLM does not do what
base.py needs on its own, this module patches or works around it: log-probs before top-k/top-p filtering
(vllm_logprobs.py), the CPU weight reload and prefix-cache reset, chunked prefill off on CPU, sleep at
level 2 on CUDA (`weights_valid` makes generate() wait for the next sync), eager on CPU; docs/engines.md
says why for each. With `lora` (rollout.lora_sync=adapters) each sync hands over only the adapters
(vllm_lora.py) and the base is loaded once; without it each adapted Linear arrives merged.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from collections.abc import Iterable, Sequence

import torch

from logicrl.models.loading import LoraSpec
from logicrl.workers.rollout import vllm_lora
from logicrl.workers.rollout.base import RolloutOutput, SamplingParams
from logicrl.workers.rollout.vllm_logprobs import patch_worker_sampler
from logicrl.workers.rollout.vllm_tp import TPGroup, external_launcher_env

SLEEP_LEVEL = 2  # discard weights and KV cache: every sync reloads every parameter (module docstring, point 4)


class WeightsDiscarded(RuntimeError):
    """generate() after a level-2 sleep with no sync_weights since: the engine's weights are garbage."""


class ExpectedAbsent(logging.Filter):
    """vLLM's layer-wise reload warns "<Layer>: Failed to load weights" for each layer the stream did not
    write and keeps that layer's own tensors: right, every sync, for the rotary embedding (a cos/sin cache
    computed at load, in no checkpoint) and for an lm_head tied to the embedding (written through it). Those
    two warnings are dropped; any other layer's still reaches the log."""

    def __init__(self, tied_lm_head: bool):
        super().__init__()
        self.tied = tied_lm_head

    def filter(self, record: logging.LogRecord) -> bool:
        if record.msg != "%s: Failed to load weights" or not record.args:
            return True
        layer = str(record.args[0])
        return not ("RotaryEmbedding" in layer or (self.tied and layer == "ParallelLMHead"))


def _reload_weights(worker, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
    """Run inside vLLM's worker: load HF-named full tensors in place, then re-pack the vocab layers."""
    from vllm.model_executor.layers.vocab_parallel_embedding import UnquantizedEmbeddingMethod

    reload_log = logging.getLogger("vllm.model_executor.model_loader.reload.layerwise")
    if not any(isinstance(f, ExpectedAbsent) for f in reload_log.filters):
        tied = bool(getattr(worker.get_model().config, "tie_word_embeddings", False))
        reload_log.addFilter(ExpectedAbsent(tied))
    worker.reload_weights(weights_iterator=iter(named_tensors), is_checkpoint_format=True)
    for module in worker.get_model().modules():
        if isinstance(getattr(module, "quant_method", None), UnquantizedEmbeddingMethod):
            # Re-creates the packed GEMM handle of the (possibly tied) lm_head from the new weight;
            # cheap: one [V, H] pack. A no-op on platforms that do not pack.
            module.quant_method.process_weights_after_loading(module)


def sampled_logprobs(flat, tokens: list[int]) -> torch.Tensor:
    """[len(tokens)] float32 from one response's FlatLogprobs (requested with logprobs=0, so each
    position holds only the sampled token's entry): one tensor over the flat list, no per-token dict."""
    if flat.token_ids != tokens:  # list equality in C; a cheap guard against a layout change
        raise RuntimeError(f"vLLM's flat log-probs list {len(flat.token_ids)} entries for {len(tokens)} sampled "
                           "tokens, or other token ids: expected exactly the sampled token at each position "
                           "(logprobs=0)")
    return torch.tensor(flat.logprobs, dtype=torch.float32)


class VLLMRolloutEngine:
    """RolloutEngine over an in-process vllm.LLM loaded from a local HF checkpoint directory.

    kv_cache_gb: KV cache size in GiB; None sizes it from gpu_memory_utilization, which on CPU is
    the fraction of the memory node the whole process may use (minus what it already uses).
    The environment variable VLLM_CPU_KVCACHE_SPACE, when set, overrides both on CPU.
    """

    def __init__(self, model_path: str, *, pad_id: int, eos_ids: Sequence[int], max_model_len: int,
                 dtype: str = "float32", seed: int = 0, gpu_memory_utilization: float = 0.5,
                 kv_cache_gb: float | None = None, max_num_seqs: int = 256, max_num_batched_tokens: int = 8192,
                 enforce_eager: bool | None = None, enable_prefix_caching: bool = True, free_cache_engine: bool = True,
                 tensor_model_parallel_size: int = 1, lora: LoraSpec | None = None):
        self.tp = tensor_model_parallel_size
        if self.tp > 1:
            external_launcher_env(self.tp)  # vllm_tp.py: vLLM adopts our world and cuts it into TP groups
        # Must be set before vLLM reads it at engine creation; "0" keeps the engine core in-process.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        import vllm

        self.pad_id = int(pad_id)
        self.eos_ids = [int(t) for t in eos_ids]
        self.max_model_len = max_model_len
        self.free_cache_engine = free_cache_engine
        cuda = torch.cuda.is_available()
        # vLLM's sleep mode (CUDA only) must be chosen at creation; on CPU the worker ignores sleep.
        self.sleep_mode = free_cache_engine and cuda
        # Adapter sync never re-sends the base, so a sleep must not discard it (module docstring).
        self.sleep_level = 1 if lora is not None else SLEEP_LEVEL
        self.lora = lora
        self.lora_request = None  # None until the first sync_adapters: the base alone (peft's B starts at 0)
        self.adapter_id = 0
        self.asleep = False
        self.weights_valid = True  # loaded from model_path; cleared by a level-2 sleep (docstring, point 4)
        self.micro_batch_size = None  # RolloutEngine: vLLM schedules its own batches, nothing to halve
        if enforce_eager is None:  # docstring, point 5
            enforce_eager = not cuda
        # vLLM's CPU worker replaces torch.set_num_threads by a no-op for the whole process (it has
        # bound its OpenMP threads); the trainer shares this process, so the original comes back.
        set_num_threads = torch.set_num_threads
        chunked_prefill = cuda  # see the module docstring, point 3
        if not chunked_prefill:
            max_num_batched_tokens = max(max_num_batched_tokens, max_model_len)
        try:
            self.llm = vllm.LLM(
                model=str(model_path), dtype=dtype, seed=seed, max_model_len=max_model_len,
                gpu_memory_utilization=gpu_memory_utilization,
                kv_cache_memory_bytes=None if kv_cache_gb is None else int(kv_cache_gb * 2**30),
                max_num_seqs=max_num_seqs, max_num_batched_tokens=max_num_batched_tokens,
                enable_chunked_prefill=chunked_prefill,
                enforce_eager=enforce_eager, enable_prefix_caching=enable_prefix_caching,
                tensor_parallel_size=self.tp,
                # "uni": one in-process worker that joins our process group as a TP-of-1 "external
                # DP" rank; "external_launcher": the same, with TP groups cut from our ranks.
                distributed_executor_backend="uni" if self.tp == 1 else "external_launcher",
                # vLLM's custom all-reduce needs every TP peer's GPU visible in this process (CUDA IPC);
                # Ray shows each rank one GPU, so TP reductions go through NCCL (as verl's SPMD rollout did).
                disable_custom_all_reduce=self.tp > 1,
                logprobs_mode="processed_logprobs", enable_sleep_mode=self.sleep_mode,
                **({} if lora is None else vllm_lora.engine_args(lora)),
            )
        finally:
            torch.set_num_threads = set_num_threads
        self.enforce_eager = enforce_eager
        self.tp_group = TPGroup() if self.tp > 1 else None
        if self.tp_group is not None and not torch.cuda.is_available():
            self.tp_group.unlink_cpu_shm_names()
        self.sampler_kind = self.llm.collective_rpc(patch_worker_sampler)[0]  # "v1" or "v2"

    def _vllm_params(self, params: SamplingParams, seed: int | None):
        import vllm

        # flat_logprobs: one list of floats per response instead of one dict per token (docstring, point 1).
        common = dict(n=1, max_tokens=params.max_tokens, seed=seed, logprobs=0, flat_logprobs=True, detokenize=False,
                      # Stop exactly at our eos_ids, not at whatever generation_config.json lists.
                      ignore_eos=True, stop_token_ids=self.eos_ids)
        if params.greedy and params.logprob_temperature == 1.0:
            return vllm.SamplingParams(temperature=0.0, **common)
        if params.greedy:  # argmax, but log-probs at the sampling temperature (see module docstring)
            return vllm.SamplingParams(temperature=params.logprob_temperature, top_k=1, **common)
        return vllm.SamplingParams(temperature=params.temperature, top_p=params.top_p,
                                   top_k=params.top_k if params.top_k > 0 else 0, **common)

    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, params: SamplingParams,
                 micro_batch_size: int | None = None) -> RolloutOutput:
        """One response per row of the left-padded prompts input_ids / attention_mask [N, P].
        `micro_batch_size` is ignored: vLLM schedules its own batches (max_num_seqs, max_num_batched_tokens).

        The controller has already repeated each prompt rollout.n times (trainer/batch.py), so every
        row is its own request with n=1; vLLM's prefix cache shares the repeated prompts' KV.
        """
        prompts = [ids[mask.bool()].tolist() for ids, mask in zip(input_ids.cpu(), attention_mask.cpu())]
        # Each request gets its own seed, drawn from params.seed: one seed for every row would
        # give the n copies of a prompt the same noise, hence the same response.
        seeds: list[int | None] = [None] * len(prompts)
        if params.seed is not None:
            g = torch.Generator().manual_seed(params.seed)
            seeds = torch.randint(0, 2**62, (len(prompts),), generator=g).tolist()
        if self.tp_group is None:
            return self._generate(prompts, seeds, params)
        # Tensor parallel: the group's members must all run the same requests (vllm_tp.py). Gathered
        # before any check, so a bad shard on one member raises the same error on every member
        # instead of leaving the others waiting in the next collective.
        shards = self.tp_group.gather((prompts, seeds, params))
        # Unseeded sampling would draw from each member's own global RNG and the members would part.
        unseeded = dataclasses.replace(params, seed=None)  # each member's rows keep their own seed
        if any(dataclasses.replace(other, seed=None) != unseeded for _, _, other in shards) or \
                (params.seed is None and not params.greedy):
            raise ValueError("tensor_model_parallel_size>1: the ranks of a TP group must generate with the same "
                             "sampling parameters, and with a seed unless greedy (HybridWorker always passes one)")
        every = self._generate([p for shard in shards for p in shard[0]], [s for shard in shards for s in shard[1]],
                               params)
        start = sum(len(shard[0]) for shard in shards[:self.tp_group.rank])
        mine = slice(start, start + len(prompts))
        return RolloutOutput(responses=every.responses[mine],
                             response_attention_mask=every.response_attention_mask[mine],
                             response_mask=every.response_mask[mine], log_probs=every.log_probs[mine])

    def _generate(self, prompts: list[list[int]], seeds: list[int | None], params: SamplingParams) -> RolloutOutput:
        if not prompts or any(len(p) == 0 for p in prompts):
            raise ValueError("generate needs at least one prompt, and every prompt at least one token")
        longest = max(map(len, prompts))
        if longest + params.max_tokens > self.max_model_len:
            raise ValueError(f"prompt of {longest} tokens + max_tokens={params.max_tokens} exceeds the engine's "
                             f"max_model_len={self.max_model_len}: raise data.max_prompt_length + "
                             "data.max_response_length or shorten the prompts")
        if not self.weights_valid:
            raise WeightsDiscarded("generate() on a vLLM engine whose weights were discarded by a level-2 sleep "
                                   "with no sync_weights since: sync the actor's weights first (HybridWorker "
                                   "does when engine.weights_valid is False)")
        if self.asleep:
            self.wake()
        from vllm.inputs import TokensPrompt

        outputs = self.llm.generate([TokensPrompt(prompt_token_ids=p) for p in prompts],
                                    [self._vllm_params(params, s) for s in seeds], use_tqdm=False,
                                    lora_request=self.lora_request)
        # LLM.generate returns requests in input order.
        samples = [request.outputs[0] for request in outputs]

        rows, width = len(prompts), params.max_tokens
        assert len(samples) == rows, f"vLLM returned {len(samples)} samples for {rows} rows"
        responses = torch.full((rows, width), self.pad_id, dtype=torch.long)  # [N, R]
        generated = torch.zeros((rows, width), dtype=torch.long)  # [N, R] 1 up to the EOS
        log_probs = torch.zeros((rows, width), dtype=torch.float32)  # [N, R]
        for row, sample in enumerate(samples):
            tokens = list(sample.token_ids)
            responses[row, :len(tokens)] = torch.tensor(tokens, dtype=torch.long)
            generated[row, :len(tokens)] = 1
            log_probs[row, :len(tokens)] = sampled_logprobs(sample.logprobs, tokens)
        # One turn: the model attends to exactly the tokens it sampled, and trains on them.
        return RolloutOutput(responses=responses, response_attention_mask=generated, response_mask=generated.clone(),
                             log_probs=log_probs)

    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load (HF name, full tensor) pairs into the running engine, consuming them as a stream.

        The iterator is handed to vLLM's layer-wise reload in this process, unbuffered: vLLM keeps a
        reference to each tensor only until every tensor of its layer has arrived (q/k/v for
        qkv_proj, gate/up for gate_up_proj), then packs that layer and drops them. The caller's
        stream (weight_sync.iter_engine_weights) gathers one bucket of update_weights_bucket_mb at a
        time, in module order, so the extra memory is that bucket plus the layer vLLM is
        assembling, never a state dict. One reload call for the whole stream, not one per bucket: a
        layer whose tensors straddle two buckets would otherwise be finalised half-loaded. Unknown
        names raise vLLM's error.
        """
        if self.asleep and self.sleep_mode:
            # Maps the weights' memory back (after level 2 its contents are garbage, and the buffers
            # vLLM saved come back) for the reload to write into; the KV cache stays released.
            self.llm.wake_up(tags=["weights"])
        self.llm.collective_rpc(_reload_weights, args=(named_tensors,))
        self.llm.reset_prefix_cache()  # cached KV was computed with the old weights
        # vLLM's reload drops every adapter (reset_lora_state: they were built over the old base), so
        # until the next sync_adapters the engine runs the base alone. Over a 4-bit base the worker
        # sends that base once, then the adapters (workers/hybrid.py).
        self.lora_request = None
        # Every parameter was streamed (weight_sync.iter_engine_weights sends the whole model), so
        # nothing discarded is left. A stream that raised part-way leaves the flag as it was.
        self.weights_valid = True

    def sync_adapters(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> list[int]:
        """Hand the engine the actor's adapters: (peft name, full A or B tensor) pairs, nothing else
        (weight_sync.iter_adapter_weights). They become a new adapter id, the old one is dropped, and
        the next generate() uses it. Returns the adapter ids the worker holds afterwards."""
        if self.lora is None:
            raise RuntimeError("sync_adapters on a vLLM engine built without LoRA: pass lora= (rollout.lora_sync="
                               "adapters), or sync merged weights with sync_weights")
        from vllm.lora.request import LoRARequest

        tensors = vllm_lora.adapter_tensors(named_tensors)
        new_id = self.adapter_id + 1
        held = self.llm.collective_rpc(vllm_lora.load_adapter, args=(new_id, tensors,
                                                                     vllm_lora.peft_config(self.lora)))[0]
        self.adapter_id = new_id
        # A fresh name too: vLLM keys prefix-cache blocks by the adapter's name.
        self.lora_request = LoRARequest(lora_name=f"logicrl-{new_id}", lora_int_id=new_id,
                                        lora_path=vllm_lora.IN_MEMORY)
        self.llm.reset_prefix_cache()
        return held

    def sleep(self) -> None:
        """CUDA: vLLM sleep level 2 (KV cache and weights discarded: weights_valid until the next sync
        is False); level 1 with the adapter sync (the weights offloaded to the host, back on wake).
        CPU: drop the prefix cache only; the KV cache and the weights stay allocated (vLLM has no sleep
        mode on CPU)."""
        if not self.free_cache_engine or self.asleep:
            return
        if self.sleep_mode:
            self.llm.sleep(level=self.sleep_level)
            self.weights_valid = self.sleep_level < 2
        else:
            self.llm.reset_prefix_cache()
        self.asleep = True

    def wake(self) -> None:
        """Map back what sleep released (after a sync only the KV cache is left to map). Waking does
        not make discarded weights valid: only sync_weights does."""
        if not self.asleep:
            return
        if self.sleep_mode:
            self.llm.wake_up()
        self.asleep = False
