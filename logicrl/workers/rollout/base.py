"""The rollout interface: sampling parameters, what an engine returns, and the engine Protocol.

Every engine (hf.py, vllm.py) satisfies `RolloutEngine`, so the step loop never knows
which one it drives. The contract that matters most is the log-prob definition below: the
trainer recomputes exactly this quantity for the same tokens, and the two must agree (that
test is what proves weight sync and the sampler are right).

Log-prob of a sampled token, for every engine:
    log_softmax(logits / T)[token]      logits: the model's raw fp32 logits at that step
                                        T: SamplingParams.logprob_temperature
computed BEFORE top-k / top-p filtering. Filtering only decides which tokens may be drawn; the
policy the trainer optimises (logicrl.models.logprob) is the unfiltered tempered softmax, so
that is what the engine reports. (vLLM's default sample log-probs are taken before temperature
is applied; the vLLM engine must produce the tempered, unfiltered value to honour this.)
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Protocol, runtime_checkable

import torch

from logicrl.algos.masked import response_lengths


@dataclass(frozen=True)
class SamplingParams:
    """How to sample; the names follow vLLM's SamplingParams and verl's rollout config."""

    temperature: float = 1.0  # 0 means greedy, as in vLLM
    top_p: float = 1.0  # nucleus mass kept; 1.0 = off
    top_k: int = -1  # most likely tokens kept; -1 = off
    max_tokens: int = 256  # response length cap, and the width R of every returned tensor
    seed: int | None = None  # None: draw from the global RNG (not reproducible)
    do_sample: bool = True  # False: greedy whatever the temperature (verl's val_kwargs.do_sample)

    def __post_init__(self):
        if self.max_tokens < 1:
            raise ValueError(f"rollout max_tokens={self.max_tokens} must be >= 1")
        if self.temperature < 0:
            raise ValueError(f"rollout temperature={self.temperature} must be >= 0 (0 = greedy)")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"rollout top_p={self.top_p} must be in (0, 1]; 1.0 turns it off")
        if self.top_k == 0 or self.top_k < -1:
            raise ValueError(f"rollout top_k={self.top_k} must be >= 1, or -1 to turn it off")

    @property
    def greedy(self) -> bool:
        return not self.do_sample or self.temperature == 0

    @property
    def logprob_temperature(self) -> float:
        """The T of the reported log-probs: the sampling temperature, or 1 when it is 0 (greedy)."""
        return self.temperature if self.temperature > 0 else 1.0


@dataclass
class RolloutOutput:
    """One response per input row, in input order. The rows are the step's prompts already
    repeated rollout.n times by the controller (trainer/batch.py), the one place groups are made.

    R is always SamplingParams.max_tokens, whatever lengths were generated: every rank and every
    step then produces the same shapes, which the memory plan and batch concatenation rely on.

    Two masks, as verl's agent loop: what the model sees and what trains. A single-turn engine
    returns them equal. Tokens the model reads but did not choose (a tool's output) have attention 1
    and loss 0; the response's length and the reward's token come from the attention mask
    (`response_lengths`), every loss, estimator and metric from the loss mask.
    """

    responses: torch.Tensor  # [N, R] int64, right-padded with the engine's pad_id
    # [N, R] int64: 1 for every token of the response the model attends to (generated tokens, the EOS
    # included, and any tool output), 0 for the padding after its end.
    response_attention_mask: torch.Tensor
    # [N, R] int64, the loss mask (verl's name): 1 for the tokens the policy sampled and trains on,
    # 0 for padding and for attended tokens it did not sample. Never 1 where the attention is 0.
    response_mask: torch.Tensor
    log_probs: torch.Tensor  # [N, R] float32, the engine's log-probs (module docstring); 0 where loss-masked
    # Per-row [N] tensors an engine adds to the batch (a multi-turn engine's turn and tool counts); none for one turn.
    extras: dict[str, torch.Tensor] = field(default_factory=dict)

    def __post_init__(self):
        if bool((self.response_mask.bool() & ~self.response_attention_mask.bool()).any()):
            raise ValueError("RolloutOutput: a token with response_mask 1 has response_attention_mask 0; "
                             "every trained token must be one the model attends to")

    @property
    def response_lengths(self) -> torch.Tensor:
        """[N] where each response ends: its last attended token + 1 (algos/masked.py)."""
        return response_lengths(self.response_attention_mask)


@runtime_checkable
class RolloutEngine(Protocol):
    """What the step loop needs from a rollout engine. Each rank calls it for its own prompt shard."""

    # False after a sleep() that discarded the engine's weights (vLLM level 2 on CUDA), until the next
    # sync_weights(); generate() refuses while it is False, so the caller must sync first.
    weights_valid: bool
    # The sequences decoded together, which the worker's OOM retry halves; None for an engine that
    # schedules its own batches (vLLM), where there is nothing to halve and an OOM is not retried.
    micro_batch_size: int | None

    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, params: SamplingParams,
                 micro_batch_size: int | None = None) -> RolloutOutput:
        """Sample one response for each row of left-padded prompts input_ids / attention_mask [N, P],
        `micro_batch_size` sequences at a time (None: the engine's own `micro_batch_size`)."""
        ...

    def sync_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load the actor's new weights, one (name, full tensor) at a time, keeping none of them
        once loaded, so the caller's stream bounds the memory (weight_sync.iter_engine_weights
        gathers bucket by bucket, never a whole state dict). Names are the engine model's own
        parameter names (HF `named_parameters()` names)."""
        ...

    def sync_adapters(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """LoRA's adapter-only sync (rollout.lora_sync=adapters): load the actor's adapter tensors, (peft
        name, full LoRA A or B tensor) pairs (weight_sync.iter_adapter_weights), over the base the engine
        loaded once; the next generate() uses them. An engine built without the run's LoRA raises."""
        ...

    def sleep(self) -> None:
        """Release what the engine holds between rollouts (KV cache, its own weight copy)."""
        ...

    def wake(self) -> None:
        """Re-acquire what sleep() released, before the next generate()."""
        ...
