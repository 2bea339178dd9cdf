"""Peak bytes of each phase on one rank, given what is resident when it starts (planner.py).

Each function returns the breakdown at the phase's highest moment. Where a phase has several
candidate moments (a backward's first and last layer, the optimizer step) all are computed and
the highest wins, so the breakdown always describes one real instant.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from logicrl.memory.engine import footprint
from logicrl.memory.footprint import (
    FP32,
    ModelBytes,
    forward_transient_per_token,
    linear_shapes,
    logprob_chunk_bytes,
    saved_per_token_layer,
    saved_per_token_root,
)
from logicrl.memory.planner_inputs import PlanInputs
from logicrl.models.spec import LOGPROB_CHUNK_TOKENS, ModelSpec

GB = 1024**3
COMPONENTS = ("params", "grads", "optimizer", "activations", "logprob", "kv_cache", "engine")


@dataclass
class PhaseMemory:
    name: str
    parts: dict[str, int] = field(default_factory=lambda: dict.fromkeys(COMPONENTS, 0))
    skipped: str | None = None  # why the phase does not run with this config
    moment: str = ""  # which instant of the phase the breakdown describes (docstrings below)

    @property
    def total(self) -> int:
        return sum(self.parts.values())


@dataclass(frozen=True)
class Models:
    """Each model's bytes, by its name in config/models.py (None: the ranks do not hold it: PlanInputs.holds)."""

    actor: ModelBytes
    ref: ModelBytes | None  # None: no separate reference (no KL term, or LoRA's disabled adapter)
    critic: ModelBytes | None
    reward_model: ModelBytes | None
    engine: ModelBytes  # the rollout engine's own full copy


def tokens_per_micro(x: PlanInputs, micro: int | None, budget: int | None, width: int | None = None,
                     rows: int | None = None) -> int:
    """Padded tokens in one micro-batch: rows x width, or a token budget (a longer row gets its own).

    A budget counts real tokens (workers/micro.py) while rows keep their padded width, so a
    micro-batch of short rows holds more padded tokens than its budget: the plan assumes rows
    near full length, the case that decides whether a run fits. `width`: the rows' padded length,
    x.width (the actor's rows) unless given (the reward model's: x.reward_width). `rows`: the rows the
    rank holds, x.responses_per_rank unless given (an SP group's, sequence_parallel below).
    """
    width = width or x.width
    if budget is not None:
        return max(budget, width)
    return min(micro, rows or x.responses_per_rank) * width


def sequence_parallel(x: PlanInputs, name: str, spec: ModelSpec, micro: int | None, budget: int | None,
                      width: int | None = None) -> tuple[int, int, int, int]:
    """(S, the micro-batch's tokens, this rank's share of them, the all-to-all buffers) of phase `name`.

    With Ulysses SP of size S (models/ulysses.py) a rank holds its group's rows (S times its own share)
    and a token budget holds S times the tokens (workers/hybrid.py), and the rank runs 1/S of each
    micro-batch's tokens through everything but attention, which runs on all of them for 1/S of the
    heads: per-token activations take the share, the attention mask (built once for the whole row) and
    the attention's keys the whole. Around one layer's attention: q, k, v of the share in one buffer,
    its exchanged copy and the head-major copy attention reads (K/V heads replicated up to S), then
    the output's three the same way; weights and optimizer states are not divided."""
    s = x.sp_of(name)
    tokens = tokens_per_micro(x, micro, budget * s if budget else None, width, rows=x.responses_per_rank * s)
    if s == 1:
        return 1, tokens, tokens, 0
    local = -(-tokens // s)
    kv = max(spec.num_kv_heads, s)
    qkv = local * (spec.num_heads + 2 * kv) * spec.head_dim * x.dtype_bytes
    out = local * spec.num_heads * spec.head_dim * x.dtype_bytes
    return s, tokens, local, 3 * qkv + 3 * out


def mask_width(x: PlanInputs, packing: str | None, width: int | None = None) -> int:
    """Keys per query in the attention mask: padded, each row's [T, T] bool mask (the rows' width,
    x.width unless given); packed (either kernel of models/attention.py), no mask at all. SDPA
    converts the mask to the query dtype in every layer."""
    return (width or x.width) if packing is None else 0


def micro_batches(x: PlanInputs, micro: int | None, budget: int | None, per_rank_mini: int) -> int:
    """Micro-batches per mini-batch; more than one means gradients accumulate (backward_phase)."""
    if budget is None:
        return math.ceil(per_rank_mini / min(micro, per_rank_mini))
    return max(1, math.ceil(per_rank_mini * x.width / max(budget, x.width)))


def batch_bytes(x: PlanInputs) -> int:
    """The rank's batch on the device: ids, mask, positions [N, P+R] int64; responses and their
    mask int64; up to five fp32 [N, R] fields (old/ref log-probs, values, advantages, returns)."""
    n = x.responses_per_rank
    return n * x.width * 3 * 8 + n * x.response_len * (2 * 8 + 5 * FP32)


def _phase(name: str, base: dict[str, int], moment: str = "", **add: int) -> PhaseMemory:
    phase = PhaseMemory(name, moment=moment)
    for key, value in {**base}.items():
        phase.parts[key] += value
    for key, value in add.items():
        phase.parts[key] += value
    return phase


def generate_phase(x: PlanInputs, m: Models, base: dict[str, int], capacity: int) -> PhaseMemory:
    """Rollout: the trainer's resident state plus the awake engine at its peak (memory/engine.py)."""
    fp = footprint(x)
    weights, kv = fp.resident(x, m.engine, capacity, awake=True)
    moment, peak = fp.generating(x)
    return _phase("generate", {**base, "engine": weights, "kv_cache": kv}, moment, **peak)


def forward_phase(name: str, x: PlanInputs, model: ModelBytes, spec: ModelSpec, base: dict[str, int],
                  micro: int, budget: int | None, lm: bool, packing: str | None = None, width: int | None = None,
                  outputs: int | None = None, rows: int = 0) -> PhaseMemory:
    """A no-grad forward in micro-batches (old_log_prob, ref, values).

    FSDP2 gathers the root unit with the first micro-batch and keeps it through the pass (the
    worker reshards it after: workers/fsdp.py reshard), and one layer at a time, twice for a
    moment while the all-gather output is copied out. The decoder's
    temporaries and the (bool) padding mask give way to the head: the final hidden states, the
    response slice copied for the chunked log-prob kernel and its [chunk, V] buffers, or the
    critic's value head. With packing (use_remove_padding) the worst case is the same tokens, all
    real; only the attention changes (no mask, K and V unrepeated: footprint.py).

    `width` (the rows' padded length, x.width unless given), `outputs` (the phase's results: by default
    an fp32 [N, R] per micro-batch, then their cat) and `rows` (inputs the phase builds beside the batch)
    are the reward model's (reward_model_phase).
    """
    b = x.dtype_bytes
    s, tokens, local, exchange = sequence_parallel(x, name, spec, micro, budget, width)
    keys = mask_width(x, packing, width)
    h = spec.hidden_size
    root = model.root_full
    if outputs is None:
        outputs = 2 * x.responses_per_rank * x.response_len * FP32  # per-micro results, then their cat
    # The bool mask lives through the forward; with SP the rank holds its group's rows and results.
    common = s * (batch_bytes(x) + outputs + rows) + tokens * keys
    decoder = local * forward_transient_per_token(spec, b, keys, packed=packing is not None) + exchange
    tokens = local  # the head and the log-prob kernel see this rank's tokens only
    resp_tokens = tokens * x.response_len // x.width
    if lm:
        chunk = logprob_chunk_bytes(spec.vocab_size, min(LOGPROB_CHUNK_TOKENS, resp_tokens), b)
        head = tokens * h * b + resp_tokens * h * b
    else:
        chunk, head = 0, tokens * h * b + tokens * b
    # A 4-bit base dequantizes one Linear at a time beside the layer's temporaries.
    gathered = forward_gathered(x.world, model) + model.dequant_transient
    if gathered + decoder >= root + head + chunk:
        return _phase(name, base, "decoder", params=gathered, activations=common + decoder)
    return _phase(name, base, "head", params=root, activations=common + head, logprob=chunk)


def reward_model_phase(x: PlanInputs, model: ModelBytes, base: dict[str, int]) -> PhaseMemory:
    """The reward model's scoring forward (workers/hybrid.py `_reward_model`): a value-head forward over
    rows x.reward_width wide, split by reward_model.micro_batch_size_per_gpu or its token budget.

    Its results are one fp32 score per row. Re-rendered rows (models/rm_inputs.py) are new ids, mask
    and positions, [N, reward_width] int64 each, on the device beside the actor's batch.
    """
    n, width, own = x.responses_per_rank, x.reward_width, x.models["reward_model"]
    rows = 3 * 8 * n * width if x.reward_rerender_len else 0
    return forward_phase("reward_model", x, model, own.spec, base, *x.split("reward_model"), lm=False,
                         packing=own.packing, width=width, outputs=2 * n * FP32, rows=rows)


def forward_gathered(world: int, model: ModelBytes) -> int:
    """Gathered parameter bytes at a forward's peak (FSDP2's wait_for_unshard), root included.

    One rank copies each unit's shard straight into its unsharded parameters: the root and one
    layer. With more, each all-gather's flat output is kept until the next unit's copy-out (to
    overlap it with the next all-gather), so at the first layer the root's output is still there
    beside the gathered root, and at any later layer three layers' worth is alive for a moment.
    """
    if world == 1:
        return model.root_full + model.layer_full
    return max(2 * model.root_full + 2 * model.layer_full, model.root_full + 3 * model.layer_full)


def backward_phase(name: str, x: PlanInputs, model: ModelBytes, spec: ModelSpec, base: dict[str, int],
                   micro: int | None, budget: int | None, per_rank_mini: int, ckpt: bool, lm: bool,
                   offload: bool = False, sharded_grads: bool = False, packing: str | None = None) -> PhaseMemory:
    """A training update (update_actor, update_critic): the highest of these moments.

    top     backward begins: every layer's saved activations, the root and the next layer
            gathered, the head's backward (for the policy: the log-prob kernel's [chunk, V]
            buffers, its [V, H] lm_head gradient and the hidden-state gradient), and the gradients
            of the earlier micro-batches. With grad_accumulation unsharded FSDP2 skips their
            reduce-scatter (set_requires_gradient_sync(False)), so every rank holds them full-size,
            whatever the world size; sharded (`sharded_grads`) reduce-scatters each backward and
            only the gradient shard accumulates.
    bottom  backward ends, at the embedding's backward: layers reduce-scattered into sharded
            gradients (the last one's unsharded input still kept), the root's gradients unsharded
            and the embedding's dense [V, H] gradient beside them.
    root gather  (several ranks) a later forward of the phase gathering the root again (below).
    step    AdamW: sharded gradients, and per tensor two temporaries (sqrt, then the denominator).
    Gradient checkpointing keeps each layer's input and recomputes one layer at a time. With
    param_offload (CUDA) the sharded gradients and the AdamW step live on the host; gathered
    parameters, unsharded gradients and activations are still on the GPU.
    """
    b, h, layers = x.dtype_bytes, spec.hidden_size, spec.num_layers
    s, whole, tokens, exchange = sequence_parallel(x, name, spec, micro, budget)  # tokens: this rank's share
    keys = mask_width(x, packing)
    resp_tokens = tokens * x.response_len // x.width
    lora = x.lora_targets if lm and x.lora_rank else ()
    per_layer = tokens * saved_per_token_layer(spec, b, keys, lora=lora, lora_rank=x.lora_rank,
                                               packed=packing is not None)
    saved = layers * tokens * h * b + per_layer if ckpt else layers * per_layer
    saved += tokens * saved_per_token_root(spec, b, trains=not lora) + whole * keys  # + the bool mask
    saved += resp_tokens * h * b if lm else tokens * h * b  # the head's input
    held = s * batch_bytes(x)  # with SP the rank holds its group's rows
    activations = held + saved + exchange  # one layer's exchange buffers at a time (its recompute or backward)
    accumulates = micro_batches(x, micro, budget * s if budget else None, per_rank_mini * s) > 1
    on_host = offload and x.device == "cuda"  # param_offload: sharded gradients live on the host
    kept_shard = model.trainable_shard if accumulates and sharded_grads and not on_host else 0
    accumulated = kept_shard if sharded_grads else (model.trainable_full if accumulates else 0)
    root = model.root_full
    head_grads = 0
    if lm:  # the log-prob kernel's hidden-state gradient, and its [V, H] lm_head gradient
        head_grads = resp_tokens * h * b + (spec.vocab_size * h * b if model.trainable_lm_head else 0)
    chunk = logprob_chunk_bytes(spec.vocab_size, min(LOGPROB_CHUNK_TOKENS, resp_tokens), b) if lm else 0
    # A 4-bit base's Linear dequantized again for its input gradient (LinearNF4's backward).
    top = _phase(name, base, "top", params=root + model.layer_full + model.dequant_transient, activations=activations,
                 grads=accumulated + head_grads, logprob=chunk)
    # Layers are reduce-scattered as backward passes them (FSDP2 keeps the last reduce-scatter's
    # input, one layer of gradients, until the next one); the root's gradient stays unsharded to the
    # end, where the embedding's dense [V, H] gradient arrives. A tied lm_head's gradient waits for
    # it in autograd's input buffer of the shared weight, so both are alive beside whatever the
    # earlier micro-batches accumulated.
    layer_grads = model.trainable_shard - (model.root_shard if model.trainable_root else 0)
    if offload and x.device == "cuda":
        layer_grads = 0  # reduce-scattered straight to the host
    # Fresh gradients come out of autograd in the compute dtype (root_full, vh); what earlier
    # micro-batches accumulated, and a reduce-scatter's input, are in the reduce dtype (fp32 under
    # a MixedPrecisionPolicy: *_reduce; the same as the compute dtype without one).
    # Sharded, the earlier micro-batches' root gradient is a shard beside the fresh full one.
    unsharded_acc = accumulates and not sharded_grads
    root_grads = 0
    if model.trainable_root:
        vh = spec.vocab_size * h * b
        if lm and spec.tie_word_embeddings:
            root_grads = (model.root_reduce if unsharded_acc else 0) + 2 * vh
        else:
            root_grads = (model.root_reduce + vh) if unsharded_acc else model.root_full
        if kept_shard:
            root_grads += model.root_shard
    bottom_grads = layer_grads + root_grads + model.layer_reduce
    if x.world > 1 and model.trainable_root:
        # Then the root's reduce-scatter: its unsharded gradient, a flat copy as the collective's
        # input (in the reduce dtype) and the sharded output. (One rank skips the copy.)
        bottom_grads = max(bottom_grads, layer_grads + model.root_full + model.root_reduce + model.root_shard +
                           (model.root_shard if kept_shard else 0))
    bottom = _phase(name, base, "bottom", params=root, activations=held, grads=bottom_grads)
    # Every forward after the first in a phase (the next micro-batch, the next mini-batch) gathers the
    # root again, since each backward reshards it; on several ranks the root's flat all-gather
    # output is then alive beside it, with the gradients accumulated so far.
    moments = [top, bottom]
    if x.world > 1:
        gather = forward_gathered(x.world, model)
        moments.append(_phase(name, base, "root gather", params=gather, grads=accumulated,
                              activations=held + tokens * h * b))
    # The final callback reshards the root before the step: only shards are held.
    step = _phase(name, base, "step", activations=held,
                  grads=0 if on_host else model.trainable_shard,
                  optimizer=0 if on_host else 2 * model.largest_trainable_shard)
    return max((*moments, step), key=lambda p: p.total)


def weight_sync_phase(x: PlanInputs, m: Models, base: dict[str, int], capacity: int) -> PhaseMemory:
    """update_weights: the actor's weights into the engine, gathered in buckets of at most
    update_weights_bucket_mb (workers/weight_sync.py), each handed over before the next is gathered.

    Each shard is cast to the engine's (compute) dtype before it is gathered, so everything below is
    in the compute dtype. FSDP2's full_tensor() on one rank returns the local shard itself, so the
    bucket holds only references, unless the cast made copies (fp32 masters under bf16): then
    it holds those, at most a bucket or the largest tensor. On more ranks it gathers each tensor
    into new memory (two full-size buffers at its peak, measured on 2 ranks) and the bucket keeps
    the gathered copies. A tensor is added to a bucket
    only while the bucket stays under the cap, and a larger one goes alone: the peak is the bucket
    held so far plus the tensor being gathered, at most max(2 x largest, bucket + largest). With
    LoRA each adapted weight is sent merged: B @ A in fp32, cast and scaled in the weight dtype,
    added to the base; on one rank the merged tensors are the bucket's only new memory. A sleeping
    vLLM wakes its weights (not its KV cache), and its layer-wise reload holds one layer's tensors
    until the layer is complete.
    """
    if x.lora_rank and x.lora_sync == "adapters":
        return adapter_sync_phase(x, m, base, capacity)
    b = x.dtype_bytes
    bucket = min(x.update_weights_bucket_mb * 2**20, m.actor.total_full)  # never more than the model
    largest = m.actor.largest_full
    if x.world > 1:
        gathered = max(2 * largest, bucket + largest)
    else:
        cast = not x.lora_rank and x.master_bytes != b  # LoRA's base is stored in the compute dtype
        gathered = max(largest, bucket) if cast else 0
    if x.lora_rank:
        shapes = linear_shapes(x.spec)
        targets = [shapes[name] for name in x.lora_targets]
        out_f, in_f = max(targets, key=lambda s: s[0] * s[1])
        if x.world == 1:
            gathered += min(bucket, x.spec.num_layers * sum(o * i for o, i in targets) * b)
        gathered += out_f * in_f * (FP32 + 3 * b)
    if x.engine_full_precision:
        gathered += m.actor.dequant_transient  # each 4-bit base weight dequantized before its merge
    weights, kv = footprint(x).syncing(x, m.engine, capacity)
    return _phase("update_weights", {**base, "engine": weights, "kv_cache": kv}, params=gathered)


def adapter_sync_phase(x: PlanInputs, m: Models, base: dict[str, int], capacity: int) -> PhaseMemory:
    """update_weights with rollout.lora_sync=adapters: only the LoRA A/B tensors, in the compute dtype
    (weight_sync.iter_adapter_weights), each a new copy (a cast, a gather, or a clone where it would
    alias the trainer's). vLLM collects them all before it builds the adapter on the host
    (rollout/vllm_lora.py), so it holds every adapter at once; hf copies each into its own as it
    arrives. A sleeping vLLM stays asleep (level 1: its base is on the host). Over an NF4 base the
    engine was also sent the base once, at build: not a step's phase (base_once below).
    """
    b = x.dtype_bytes
    shapes = linear_shapes(x.spec)
    # Every adapter is an fp32 master (footprint.py), so the full set in the compute dtype is this.
    adapters = m.actor.trainable_full // FP32 * b
    largest = max(max(o, i) * x.lora_rank * b for o, i in (shapes[name] for name in x.lora_targets))
    fp = footprint(x)
    held = fp.adapters_held(adapters, largest)
    gathered = held + (largest if x.world > 1 else 0)  # the all-gather in flight beside what is held
    weights, kv = fp.resident(x, m.engine, capacity, awake=False)
    return _phase("update_weights", {**base, "engine": weights, "kv_cache": kv}, "adapters", params=gathered)


def base_once(x: PlanInputs, m: Models, base: dict[str, int], capacity: int) -> PhaseMemory | None:
    """The adapter sync over an NF4 base whose engine loaded the checkpoint in the compute dtype: the
    engine is sent the base once, at build (workers/hybrid.py), awake with its KV cache: every base
    tensor in the compute dtype, no adapters, each 4-bit Linear dequantized (its transient) into a new
    tensor, a bucket of them held at most. None where no such stream runs. The AdamW states in `base`
    do not exist yet at build; the adapters' are small, and the plan keeps them."""
    if not (x.lora_rank and x.lora_sync == "adapters" and x.engine_full_precision):
        return None
    b, shapes = x.dtype_bytes, linear_shapes(x.spec)
    bucket = min(x.update_weights_bucket_mb * 2**20, m.engine.total_full)  # the base in the compute dtype
    if x.world > 1:
        stream = max(2 * m.engine.largest_full, bucket + m.engine.largest_full)
    else:  # the rest of the base is stored in the compute dtype: only the dequantized Linears are new
        stream = min(bucket, x.spec.num_layers * sum(o * i for o, i in shapes.values()) * b)
    weights, kv = footprint(x).resident(x, m.engine, capacity, awake=True)
    return _phase("update_weights", {**base, "engine": weights, "kv_cache": kv}, "the 4-bit base once, at build",
                  params=stream + m.actor.dequant_transient)


# The worker phases planned by a footprint of their own, each given (inputs, models, what every rank holds,
# capacity); every other worker phase is planned from its row in config/phases.py (planner.py): a forward,
# or a training update, of its model.
FOOTPRINTS = {
    "generate": generate_phase,
    "reward_model": lambda x, m, base, capacity: reward_model_phase(x, m.reward_model, base),
    "update_weights": weight_sync_phase,
}
