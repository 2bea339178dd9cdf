"""Where a step's time goes: generation throughput and its tail, trainer throughput, the update's MFU.

Every number comes from what the step already holds (its batch's masks, the phases' times, each
rank's own generate time), so the metrics cost list arithmetic, no device work (benchmarks/step_perf.py).

FLOPs (docs/performance.md derives them): with N the decoder's and lm_head's Linear weights, N_l the
LoRA adapters', T a pass's real tokens and A = 2 * layers * heads * head_dim * sum(L_i^2) the causal
attention scores and mixing (QK^T and AV, half of each L x L product) over its sequences of L_i tokens:
    forward                    2 (N + N_l) T + A
    update, full fine-tuning   6 N T + 3 A             (backward: activation grads + weight grads)
    update, LoRA               4 N T + 6 N_l T + 3 A   (the frozen base gets no weight grads)
    gradient checkpointing     one more forward, counted in hardware FLOPs (HFU), not in model FLOPs (MFU)
times ppo_epochs. MFU = model FLOPs / (the slowest rank's update time x ranks x the device's bf16 peak).
"""

from __future__ import annotations

from dataclasses import dataclass

from logicrl.algos.masked import response_lengths
from logicrl.config.phases import FORWARD_PHASES, UPDATE_PHASES
from logicrl.memory.footprint import linear_shapes, lora_targets
from logicrl.models.spec import ModelSpec
from logicrl.timeplan.devices import device


def peak_bf16_flops(device_name: str | None) -> float | None:
    """FLOP/s at the device's dense bf16 peak (the time plan's device table, timeplan/devices.py); None for a
    device the table does not know (or none)."""
    row = device(device_name)
    return row.bf16_tflops * 1e12 if row else None


@dataclass(frozen=True)
class FlopModel:
    matmul_params: int  # N: every Linear of the decoder layers, and the lm_head
    lora_params: int  # N_l: the adapters' A and B (0 without LoRA)
    layers: int
    attn_width: int  # heads x head_dim: the width of QK^T's and AV's contractions

    @classmethod
    def of(cls, spec: ModelSpec, lora_rank: int = 0, target_modules=None) -> FlopModel:
        shapes = linear_shapes(spec)
        per_layer = sum(out * inp for out, inp in shapes.values())
        adapted = lora_targets(target_modules, spec.num_layers) if lora_rank else ()
        lora = sum(lora_rank * sum(shapes[name]) for name in adapted) * spec.num_layers
        return cls(matmul_params=per_layer * spec.num_layers + spec.vocab_size * spec.hidden_size,
                   lora_params=lora, layers=spec.num_layers, attn_width=spec.num_heads * spec.head_dim)

    def attention(self, lengths: list[int]) -> float:
        return 2.0 * self.layers * self.attn_width * sum(n * n for n in lengths)

    def forward(self, lengths: list[int]) -> float:
        return 2.0 * (self.matmul_params + self.lora_params) * sum(lengths) + self.attention(lengths)

    def update(self, lengths: list[int], checkpointing: bool) -> tuple[float, float]:
        """(model FLOPs, hardware FLOPs) of one pass of forward and backward over `lengths`."""
        tokens, attn = sum(lengths), self.attention(lengths)
        if self.lora_params:
            model = 4.0 * self.matmul_params * tokens + 6.0 * self.lora_params * tokens + 3 * attn
        else:
            model = 6.0 * self.matmul_params * tokens + 3 * attn
        return model, model + (self.forward(lengths) if checkpointing else 0.0)


def generation_metrics(rank_tokens: list[int], rank_seconds: list[float], gen_seconds: float,
                       response_lengths: list[int]) -> dict[str, float]:
    """Tokens/s per rank (its responses' tokens over its own generate time) and in all (every token over
    the controller's generate time), and the tail: the slowest rank's time over the mean rank's, the
    longest response over the mean. A tail near 1 means no rank waits on another's long sequences."""
    out = {f"perf/gen_tokens_per_s/rank{r}": t / max(s, 1e-9) for r, (t, s) in enumerate(zip(rank_tokens,
                                                                                                rank_seconds))}
    out["perf/gen_tokens_per_s"] = sum(rank_tokens) / max(gen_seconds, 1e-9)
    mean_s = sum(rank_seconds) / len(rank_seconds)
    out["perf/gen_rank_tail"] = max(rank_seconds) / mean_s if mean_s > 0 else 1.0
    mean_len = sum(response_lengths) / len(response_lengths)
    out["perf/response_length_tail"] = max(response_lengths) / mean_len if mean_len > 0 else 1.0
    return out


def trainer_metrics(lengths: list[int], timings: dict[str, float], epochs: dict[str, int]) -> dict[str, float]:
    """Tokens/s of each forward pass and update that ran (`timings`: phase -> seconds): the rows' real
    tokens (prompt and response) over the phase's time; an update passes over them `epochs[phase]` times."""
    tokens = sum(lengths)
    return {f"perf/{phase}/tokens_per_s": tokens * epochs.get(phase, 1) / max(seconds, 1e-9)
            for phase, seconds in timings.items()}


def mfu_metrics(flops: FlopModel, lengths: list[int], epochs: int, checkpointing: bool, seconds: float,
                ranks: int, peak: float | None) -> dict[str, float]:
    """The actor update's model and hardware FLOPs utilisation; nothing where the peak is unknown."""
    if peak is None or seconds <= 0:
        return {}
    model, hardware = flops.update(lengths, checkpointing)
    budget = seconds * ranks * peak
    return {"perf/update_actor/mfu": epochs * model / budget, "perf/update_actor/hfu": epochs * hardware / budget,
            "perf/update_actor/tflops_per_rank": epochs * model / seconds / ranks / 1e12}


def generation_round(response_attention_mask, ranks: int) -> tuple[list[int], list[int]]:
    """One generation round as `step_metrics` reads it, from its rows' response attention mask [N, R]
    (rank r generated the r-th contiguous shard): each rank's tokens and every response's length, where
    each response ends (algos/masked.py), not how many of its tokens train."""
    lengths = response_lengths(response_attention_mask)  # [N]
    return [int(part.sum()) for part in lengths.chunk(ranks)], lengths.tolist()


def step_metrics(generated: list[tuple[list[int], list[int]]], rank_seconds: list[float], metrics: dict,
                 attention_mask, epochs: dict[str, int], flops: FlopModel, checkpointing: bool,
                 training_ranks: int, peak: float | None) -> dict[str, float]:
    """All of a step's perf/ metrics. `generated`: per generation round, each rank's generated tokens and
    every response's length; `rank_seconds`: each generating rank's own generate time (its rounds summed); `metrics`:
    the step's so far (timing_s/<phase>, perf/worker_timing_s/update_actor); `attention_mask` [N, P+R] of
    the trained rows, None when nothing was trained."""
    rank_tokens = [sum(tokens[r] for tokens, _ in generated) for r in range(len(rank_seconds))]
    lengths = [n for _, round_lengths in generated for n in round_lengths]
    out = generation_metrics(rank_tokens, rank_seconds, metrics["timing_s/generate"], lengths)
    if attention_mask is None:
        return out
    seqs = attention_mask.sum(-1).tolist()
    timed = {p: metrics[f"timing_s/{p}"] for p in (*FORWARD_PHASES, *UPDATE_PHASES) if f"timing_s/{p}" in metrics}
    out.update(trainer_metrics(seqs, timed, epochs))
    if "perf/worker_timing_s/update_actor" in metrics:
        out.update(mfu_metrics(flops, seqs, epochs["update_actor"], checkpointing,
                               metrics["perf/worker_timing_s/update_actor"], training_ranks, peak))
    return out


def phase_shares(totals: dict[str, float]) -> str:
    """'generate 61%, update_actor 22%, ...' over the phases' summed times, largest first."""
    whole = sum(totals.values())
    if whole <= 0:
        return ""
    parts = sorted(totals.items(), key=lambda kv: -kv[1])
    return ", ".join(f"{phase} {100 * t / whole:.0f}%" for phase, t in parts if t / whole >= 0.005)
