"""Rollout with the HF model itself: a manual KV-cached sampling loop, micro-batched.

The fallback engine where vLLM is absent, and the reference the vLLM engine is checked
against. It samples with the module it is given: in training its own full copy of the policy
(engines._hf loads it from model.path; sync_weights() copies the actor's weights in after each
update), in tests possibly the actor's module itself, when sync_weights() has nothing to copy.
sleep()/wake() release nothing: the KV cache lives only inside one generate() call.

Why not `model.generate`: it draws from the global RNG (no per-call generator, so no
reproducible rollouts without touching global state), its `scores` are taken after its logits
processors, and getting the unfiltered tempered log-prob (base.py) would mean keeping every
step's raw [b, V] logits and re-scoring them. The loop below is short and does exactly that.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

import torch
from torch import nn
from transformers import DynamicCache

from logicrl.workers.rollout.base import RolloutOutput, SamplingParams


def row_generators(seed: int | None, rows: range, device: torch.device) -> list[torch.Generator] | None:
    """One generator per response row, seeded from (seed, the row's index in the whole call)."""
    if seed is None:
        return None
    return [torch.Generator(device=device).manual_seed((seed * 1_000_003 + row) % 2**63) for row in rows]


def sample_tokens(logits: torch.Tensor, params: SamplingParams,
                  generators: list[torch.Generator] | None) -> tuple[torch.Tensor, torch.Tensor]:
    """Draw one token per row and report its log-prob (base.py's definition).

    logits [b, V] raw model logits -> tokens [b] int64, log_probs [b] float32
    top-k then top-p, as vLLM applies them; greedy takes the argmax of the raw logits.
    Row i draws one uniform from generators[i] and inverts the CDF, so a row's sample depends on
    its own seed only, not on which rows share its micro-batch: halving the micro-batch after an
    OOM (workers/oom.py) reproduces the same responses.
    """
    logits = logits.float()
    log_probs = torch.log_softmax(logits / params.logprob_temperature, dim=-1)  # [b, V], before filtering
    if params.greedy:
        tokens = logits.argmax(dim=-1)
    else:
        z = logits / params.temperature  # [b, V]
        if params.top_k > 0 and params.top_k < z.shape[-1]:
            kth = torch.topk(z, params.top_k, dim=-1).values[:, -1:]  # [b, 1]
            z = z.masked_fill(z < kth, float("-inf"))
        if params.top_p < 1.0:
            sorted_z, order = torch.sort(z, dim=-1, descending=True)  # [b, V]
            sorted_p = torch.softmax(sorted_z, dim=-1)
            # Drop a token when the mass strictly before it already reaches top_p; the most
            # likely token has nothing before it, so at least one token always survives.
            drop_sorted = (sorted_p.cumsum(dim=-1) - sorted_p) >= params.top_p
            drop = drop_sorted.scatter(-1, order, drop_sorted)  # back to vocabulary order
            z = z.masked_fill(drop, float("-inf"))
        probs = torch.softmax(z, dim=-1)  # [b, V]
        if generators is None:
            u = torch.rand(probs.shape[0], device=probs.device)  # [b]
        else:
            u = torch.cat([torch.rand(1, generator=g, device=probs.device) for g in generators])  # [b]
        cdf = probs.cumsum(dim=-1)  # [b, V]
        # The first token whose CDF exceeds u (scaled by the row's total against rounding); a
        # filtered token adds nothing to the CDF, so it can never be the first to exceed u.
        tokens = torch.searchsorted(cdf, (u * cdf[:, -1])[:, None], right=True).squeeze(-1)
        tokens = tokens.clamp(max=probs.shape[-1] - 1)
    return tokens, log_probs.gather(-1, tokens[:, None]).squeeze(-1)


class HFRolloutEngine:
    """RolloutEngine over a HF *ForCausalLM (or a peft wrapper of one).

    micro_batch_size caps the sequences decoded together, so the KV cache and the [b, V] logits
    of a step stay bounded whatever the number of rows is; `generate` may be given a smaller one
    (the worker's OOM retry halves it).
    """

    def __init__(self, model: nn.Module, pad_id: int, eos_ids: Sequence[int], micro_batch_size: int):
        if micro_batch_size < 1:
            raise ValueError(f"rollout micro_batch_size={micro_batch_size} must be >= 1")
        self.model = model
        self.pad_id = int(pad_id)
        self.eos_ids = [int(t) for t in eos_ids]  # may be empty: then only max_tokens stops a response
        self.micro_batch_size = micro_batch_size

    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, params: SamplingParams,
                 micro_batch_size: int | None = None) -> RolloutOutput:
        """One response per row of the left-padded prompts input_ids / attention_mask [N, P]."""
        if input_ids.shape[0] == 0 or not bool(attention_mask[:, -1].all()):
            raise ValueError("generate needs at least one prompt, every prompt left-padded and at least one token")
        micro = micro_batch_size or self.micro_batch_size
        device = next(self.model.parameters()).device
        input_ids, attention_mask = input_ids.to(device), attention_mask.to(device)
        rows = input_ids.shape[0]

        chunks = []
        was_training = self.model.training
        self.model.eval()  # dropout off; HF also skips gradient checkpointing in eval mode
        try:
            # no_grad, not inference_mode: the returned ids feed the trainer's forward, where
            # inference tensors cannot be saved for backward (the embedding saves its indices).
            with torch.no_grad():
                for start in range(0, rows, micro):
                    end = min(start + micro, rows)
                    generators = row_generators(params.seed, range(start, end), device)
                    chunks.append(self._generate_micro_batch(input_ids[start:end], attention_mask[start:end], params,
                                                             generators, device))
        finally:
            self.model.train(was_training)
        responses, generated, log_probs = (torch.cat(parts) for parts in zip(*chunks, strict=True))
        # One turn: the model attends to exactly the tokens it sampled, and trains on them.
        return RolloutOutput(responses=responses, response_attention_mask=generated, response_mask=generated.clone(),
                             log_probs=log_probs)

    def _generate_micro_batch(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, params: SamplingParams,
                              generators: list[torch.Generator] | None, device: torch.device):
        # Left padding: every row's next token is at the last column. The rows were padded to the
        # longest prompt of the whole batch; columns that are padding in every row are dropped.
        first = int(attention_mask.any(0).long().argmax())
        input_ids, attention_mask = input_ids[:, first:], attention_mask[:, first:].long()  # [b, P]
        b, steps = input_ids.shape[0], params.max_tokens
        # Positions count real tokens only, so a padded prompt sees the positions it would alone.
        position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)  # [b, P]
        next_position = position_ids[:, -1:] + 1  # [b, 1]

        responses = torch.full((b, steps), self.pad_id, dtype=torch.long, device=device)  # [b, R]
        generated = torch.zeros((b, steps), dtype=torch.long, device=device)  # [b, R] 1 up to the EOS
        log_probs = torch.zeros((b, steps), dtype=torch.float32, device=device)  # [b, R]
        eos = torch.tensor(self.eos_ids, dtype=torch.long, device=device)
        finished = torch.zeros(b, dtype=torch.bool, device=device)  # [b]

        cache = DynamicCache(config=self.model.config)
        # logits_to_keep=1: the prefill only needs the last position's logits, not [b, P, V].
        logits = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=position_ids,
                            past_key_values=cache, use_cache=True, logits_to_keep=1).logits[:, -1]  # [b, V]
        for step in range(steps):
            tokens, token_log_probs = sample_tokens(logits, params, generators)  # [b], [b]
            alive = ~finished
            responses[:, step] = torch.where(alive, tokens, self.pad_id)
            generated[:, step] = alive.long()
            log_probs[:, step] = torch.where(alive, token_log_probs, 0.0)
            finished |= alive & torch.isin(tokens, eos)
            if step == steps - 1 or bool(finished.all()):
                break
            # Finished rows keep decoding (a batch moves together) but their tokens are discarded
            # above; their attention stays 1 so no row ever has an all-masked query.
            attention_mask = torch.cat([attention_mask, attention_mask.new_ones(b, 1)], dim=-1)  # [b, P+step+1]
            logits = self.model(input_ids=responses[:, step:step + 1], attention_mask=attention_mask,
                                position_ids=next_position, past_key_values=cache, use_cache=True).logits[:, -1]
            next_position = next_position + 1
        return responses, generated, log_probs

    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy (name, full tensor) pairs into the model as they arrive.

        When the engine shares the actor's module every tensor is already the engine's own and
        nothing is copied. A separate copy (the engine's model beside an FSDP2 actor, as
        HybridWorker builds it) receives the gathered tensors here; the caller must pass full
        tensors, not DTensor shards. Nothing is kept after its copy, so the memory a sync adds is
        what the caller's stream holds: one bucket of update_weights_bucket_mb with
        weight_sync.iter_engine_weights (tests/workers/test_weight_sync.py measures it). Tied
        parameters are listed under every name, so either name works. Under the engine's own peft
        adapters (rollout.lora_sync=adapters) a base tensor is also found by its plain HF name, as
        the base stream over a 4-bit base names it (weight_sync.iter_engine_weights, merge_lora=False).
        """
        own = dict(self.model.named_parameters(remove_duplicate=False))
        own.update(self.model.named_buffers(remove_duplicate=False))
        # peft's 'base_model.model.x.q_proj.base_layer.weight' is also 'x.q_proj.weight'.
        own.update({n.removeprefix("base_model.model.").replace(".base_layer.", "."): t for n, t in list(own.items())
                    if n.startswith("base_model.model.") and ".lora_" not in n})
        with torch.no_grad():
            for name, tensor in named_tensors:
                if name not in own:
                    raise KeyError(f"sync_weights: {name!r} is not a parameter or buffer of the rollout model "
                                   f"{type(self.model).__name__}")
                target = own[name]
                if target.data_ptr() != tensor.data_ptr():
                    target.copy_(tensor)

    def sync_adapters(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy the actor's LoRA A/B tensors (peft names, weight_sync.iter_adapter_weights) into the
        engine's own peft adapters, in place; the base is never touched (engines._hf builds the model
        with the run's adapters when rollout.lora_sync=adapters)."""
        self.sync_weights(named_tensors)

    weights_valid = True  # sleep() never discards anything

    def sleep(self) -> None:
        """Nothing to release: the KV cache lives only inside one generate() call and the weights
        belong to the trainer."""

    def wake(self) -> None:
        """Nothing to re-acquire (see sleep)."""
