"""Bytes of one model's pieces: parameter tensors, FSDP2 shards, saved activations, KV cache.

Pure arithmetic on a ModelSpec (no torch), so the preflight can run before anything loads. Every
count below was read off the code that allocates it (transformers 5 Qwen2/Llama with SDPA,
torch 2.13 FSDP2 and autograd, logicrl/models/logprob.py) and checked tensor by tensor with
autograd's saved-tensor hooks on CPU in fp32 and bf16; benchmarks/memory_plan.py checks the
totals against measured peaks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from logicrl.models.lora_targets import LINEARS, is_all_linear, layer_module, matches
from logicrl.models.spec import ModelSpec

# The smallest KV cache vLLM gets on CPU (workers/rollout/engines.py kv_cache_gb): it needs a few
# blocks of headroom beyond the sequences it schedules at once.
MIN_KV_CACHE_GB = 0.0625

FP32 = 4


def linear_shapes(spec: ModelSpec) -> dict[str, tuple[int, int]]:
    """[out, in] of each Linear in one decoder layer."""
    h, q, kv, i = spec.hidden_size, spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim, \
        spec.intermediate_size
    return {"q_proj": (q, h), "k_proj": (kv, h), "v_proj": (kv, h), "o_proj": (h, q),
            "gate_proj": (i, h), "up_proj": (i, h), "down_proj": (h, i)}


def lora_targets(target_modules, layers: int = 1) -> tuple[str, ...]:
    """The decoder Linears peft adapts in any of the first `layers` layers for `target_modules`
    ("all-linear", a list of names or dotted suffixes, or a regular expression over full names:
    peft's rules, models/lora_targets.py). The plan sizes an adapted Linear in every layer."""
    if is_all_linear(target_modules):
        return LINEARS
    return tuple(n for n in LINEARS if any(matches(target_modules, layer_module(n, i)) for i in range(layers)))


def shard(shape: tuple[int, ...], world: int) -> int:
    """Elements FSDP2 keeps on one rank: dim 0 split in `world` chunks, padded to the largest."""
    rest = math.prod(shape[1:])
    return math.ceil(shape[0] / world) * rest


@dataclass(frozen=True)
class ModelBytes:
    """One role's parameters (actor, reference, critic or engine copy) on one rank, in bytes.

    `layer_*` is one decoder layer (an FSDP unit), `root_*` the rest (embeddings, final norm,
    lm_head or value head), the root FSDP unit. `trainable_*` counts what gets gradients and
    AdamW states: every parameter, or only the LoRA adapters (kept in fp32 by peft).

    Two widths per tensor (workers/hybrid.py): the compute dtype, in which FSDP2 gathers a unit's
    parameters (`*_full`: gathered, what forward, backward and weight sync hold); and the master
    dtype, in which the shards, their gradients and AdamW states are stored (`*_shard`) and
    gradients reduced (`*_reduce`, `trainable_full`: FSDP2's MixedPrecisionPolicy reduces and
    accumulates in fp32). The trained actor and critic keep fp32 masters under a narrower compute
    dtype; the reference, the engine and a LoRA base store what they compute in.
    """

    total_full: int
    total_shard: int
    layer_full: int
    root_full: int
    root_shard: int
    trainable_full: int  # the unsharded gradients kept between micro-batches (accumulated in fp32)
    trainable_shard: int
    largest_full: int  # the biggest single tensor (gathered alone when larger than a weight-sync bucket)
    largest_trainable_shard: int  # AdamW's per-tensor temporaries
    trainable_root: bool  # embeddings and head train (not with LoRA)
    trainable_lm_head: bool  # the chunked log-prob kernel builds a [V, H] weight gradient
    layer_reduce: int = 0  # one layer's gradients as reduce-scattered (the collective's input)
    root_reduce: int = 0  # the root's, likewise
    # A 4-bit base (models/quantize.py): its largest Linear dequantized into the compute dtype, the
    # transient of each of its forwards and backwards (and of a merged weight sync); 0 otherwise.
    dequant_transient: int = 0

    @classmethod
    def build(cls, spec: ModelSpec, *, dtype_bytes: int, world: int, head: str = "lm", lora_rank: int = 0,
              lora_targets_: tuple[str, ...] = (), base_weight_bits: float | None = None,
              master_bytes: int | None = None, base_replicated: bool = False) -> ModelBytes:
        """head: "lm" (a causal LM) or "value" (the critic: a 1-output token head, no lm_head).
        dtype_bytes: the compute dtype; master_bytes: the stored dtype (None: the same).
        base_weight_bits: the decoder Linears of a frozen 4-bit base; `base_replicated`: they are whole
        on every rank (logicrl's NF4 base: FSDP2 leaves them out, models/quantize.py), not sharded."""
        h, v = spec.hidden_size, spec.vocab_size
        mb = dtype_bytes if master_bytes is None else master_bytes
        # (shape, compute bytes, master bytes) per tensor. A frozen 4-bit base stores decoder Linears at
        # base_weight_bits (an NF4 or GPTQ base, or a what-if: planner_inputs.py).
        linear_bytes = dtype_bytes if base_weight_bits is None else base_weight_bits / 8
        layer: list[tuple[tuple[int, ...], float, float]] = [
            (s, linear_bytes, mb if base_weight_bits is None else linear_bytes) for s in linear_shapes(spec).values()]
        layer += [((h,), dtype_bytes, mb)] * 2  # input and post-attention RMSNorm weights
        if spec.attention_bias:
            q, kv = spec.num_heads * spec.head_dim, spec.num_kv_heads * spec.head_dim
            layer += [((q,), dtype_bytes, mb), ((kv,), dtype_bytes, mb), ((kv,), dtype_bytes, mb)]
        adapters = []
        for name in lora_targets_ if lora_rank else ():
            out_f, in_f = linear_shapes(spec)[name]
            # fp32 masters, gathered and computed in the compute dtype (workers/hybrid.py)
            adapters += [((lora_rank, in_f), dtype_bytes, FP32), ((out_f, lora_rank), dtype_bytes, FP32)]
        root: list[tuple[tuple[int, ...], float, float]] = [((v, h), dtype_bytes, mb), ((h,), dtype_bytes, mb)]
        if head == "lm" and not spec.tie_word_embeddings:
            root.append(((v, h), dtype_bytes, mb))
        if head == "value":
            root += [((1, h), dtype_bytes, mb), ((1,), dtype_bytes, mb)]

        def full(ts):  # gathered, in the compute dtype
            return int(sum(math.prod(s) * b for s, b, _ in ts))

        def full_master(ts):  # whole tensors in the master dtype (reduced, accumulated gradients)
            return int(sum(math.prod(s) * m for s, _, m in ts))

        def sharded(ts):  # this rank's shards, in the master dtype
            return int(sum(shard(s, world) * m for s, _, m in ts))

        layers = spec.num_layers
        per_layer = layer + adapters
        trainable = adapters * layers if lora_rank else per_layer * layers + root
        everything = per_layer * layers + root
        # A replicated 4-bit base: each rank holds its Linears whole rather than a shard of them.
        replicated = 0
        if base_weight_bits is not None and base_replicated:
            replicated = int(layers * sum((math.prod(s) - shard(s, world)) * linear_bytes
                                          for s in linear_shapes(spec).values()))
        return cls(
            total_full=full(everything), total_shard=sharded(everything) + replicated,
            layer_full=full(per_layer), root_full=full(root), root_shard=sharded(root),
            trainable_full=full_master(trainable), trainable_shard=sharded(trainable),
            largest_full=max(int(math.prod(s) * b) for s, b, _ in everything),
            largest_trainable_shard=max(int(shard(s, world) * m) for s, _, m in trainable),
            trainable_root=not lora_rank, trainable_lm_head=head == "lm" and not lora_rank,
            layer_reduce=full_master(per_layer), root_reduce=full_master(root),
            dequant_transient=dequant_bytes(spec, dtype_bytes) if base_weight_bits else 0)


def dequant_bytes(spec: ModelSpec, dtype_bytes: int) -> int:
    """Peak bytes of dequantizing the largest decoder Linear (torchao's NF4Tensor.get_original_weight,
    read off its code): both nibbles of every byte as int64 (8 bytes a weight), the looked-up values,
    their scaled copies and the stacked result in the compute dtype (3 x dtype), alive together
    before it returns the weight. A GPTQ kernel dequantizes tile by tile (less); counted the same."""
    return (8 + 3 * dtype_bytes) * max(math.prod(s) for s in linear_shapes(spec).values())


def kv_bytes_per_token(spec: ModelSpec, dtype_bytes: int) -> int:
    """K and V of every layer for one token."""
    return 2 * spec.num_layers * spec.num_kv_heads * spec.head_dim * dtype_bytes


def saved_per_token_layer(spec: ModelSpec, b: int, width: int, *, lora: tuple[str, ...] = (),
                          lora_rank: int = 0, packed: bool = False) -> int:
    """Bytes autograd keeps per token per decoder layer until backward (no checkpointing).

    b: parameter dtype bytes; width: the padded sequence length of the micro-batch. Checked
    exactly against saved-tensor hooks (tests/memory/test_footprint.py has the hand count):
      RMSNorm x2     its input upcast to fp32 (4H, the input itself in fp32), and weight*h saves
                     h (bH) when the weight trains
      q,k,v / gate,up / down   each Linear saves its input: the norm output (bH) and the MLP
                     product (bI), shared by the Linears that read them; a frozen Linear saves
                     nothing, a LoRA Linear's lora_A saves the same input (the adapters compute in
                     the model's dtype: FSDP2 gathers them so, workers/hybrid.py), and lora_A's
                     output (r values) for lora_B
      attention      q after RoPE, K and V repeated to every head (HF repeats them when a padding
                     mask is present, which RL batches always have), and SDPA's output, which is
                     also o_proj's input: 4 x bq; SDPA's fp32 logsumexp (4 x heads); and the padding
                     mask, which SDPA converts from bool to the query dtype in every layer: b x width
                     `packed` (models/attention.py, either kernel): q, K and V unrepeated (b x (q + 2 kv))
                     and the output; no mask (width 0); the fp32 logsumexp counted as above (flash-attn
                     keeps it, the per-sequence SDPA recomputes it in backward: 4 bytes a head high there)
      MLP            gate (SiLU's input), SiLU(gate), up: 3 x bI
    """
    h, i = spec.hidden_size, spec.intermediate_size
    q = spec.num_heads * spec.head_dim
    trains = not lora  # full fine-tuning: every weight gets a gradient
    norms = 2 * (FP32 * h + FP32 + (b * h if trains else 0))  # + the fp32 rsqrt per token
    inputs = {"q_proj": h, "k_proj": h, "v_proj": h, "o_proj": q, "gate_proj": h, "up_proj": h, "down_proj": i}
    shared = {"q_proj": "n1", "k_proj": "n1", "v_proj": "n1", "o_proj": "attn", "gate_proj": "n2",
              "up_proj": "n2", "down_proj": "prod"}
    kept = {shared[name] for name in inputs if name in lora or trains}
    own = {"n1": h, "n2": h, "prod": i, "attn": 0}  # "attn" is SDPA's output, counted below
    linear_inputs = sum(b * own[k] for k in kept) + b * lora_rank * len(lora)
    if packed:
        attention = b * (2 * q + 2 * spec.num_kv_heads * spec.head_dim) + FP32 * spec.num_heads
    else:
        attention = 4 * b * q + FP32 * spec.num_heads + b * width
    mlp = 3 * b * i
    return norms + linear_inputs + attention + mlp


def saved_per_token_root(spec: ModelSpec, b: int, trains: bool = True) -> int:
    """Saved per token outside the layers: the final norm's fp32 input, rsqrt and (when its weight
    trains) h; RoPE's cos and sin; the input ids."""
    return FP32 * spec.hidden_size + FP32 + (b * spec.hidden_size if trains else 0) + 2 * b * spec.head_dim + 8


def forward_transient_per_token(spec: ModelSpec, b: int, width: int, packed: bool = False) -> int:
    """Peak of one layer's temporaries per token in a no-grad forward (nothing is kept).

    The MLP holds SiLU(gate), up and their product at once (3 x bI); attention holds q, the
    repeated K and V and the output (4 x bq) plus the mask SDPA converts to the query dtype, or
    `packed` (models/attention.py) q, unrepeated K and V and the output, no mask; the residual
    stream and the norm's fp32 upcast sit beside either.
    """
    h, i = spec.hidden_size, spec.intermediate_size
    q = spec.num_heads * spec.head_dim
    attention = b * (2 * q + 2 * spec.num_kv_heads * spec.head_dim) if packed else 4 * b * q + b * width
    return 2 * b * h + FP32 * h + max(3 * b * i, attention)


def logprob_chunk_bytes(vocab: int, rows: int, b: int) -> int:
    """logprob.py's per-chunk buffers: two fp32 [rows, V] (log-softmax plus logsumexp's, or the
    entropy's, or backward's p), and the matmul's own [rows, V] output in the weight dtype before
    the fp32 upcast (the same buffer in fp32)."""
    return (2 * FP32 + (b if b < FP32 else 0)) * rows * vocab
