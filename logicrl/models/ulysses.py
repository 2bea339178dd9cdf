"""Ulysses sequence parallelism (DeepSpeed-Ulysses, as verl runs it) around any transformers attention.

    sp = SequenceParallel(group, size, rank)                  # the ranks that share one packed row
    use_ulysses(model)                                         # once, after loading
    out, start, stop = sp_forward(model, packed_ids, packed_positions, sp)   # [1, L/S, ...] of this rank
    full = gather_tokens(local_values, packed_index, start, stop, sp)        # [M, ...], same on every rank

Each rank of an SP group of size S runs the model on its L/S tokens of the same packed row; around
attention an all-to-all trades the sequence shard for a head shard ([1, H, L/S, D] -> [1, H/S, L, D]),
the inner attention ("ulysses:<inner>" in transformers' AttentionInterface) runs on whole sequences and a
second all-to-all trades back. That name has no mask function, so the wrapper builds the inner mask once
for the whole padded row. KV heads not divisible by S are replicated S / KV times before the split.
Why the gradients equal SP = 1's: docs/engines.md, "Sequence parallelism (Ulysses)".
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field

import torch
import torch.distributed as dist

PREFIX = "ulysses:"


@dataclass(frozen=True)
class SequenceParallel:
    """The group of ranks that split one packed row: `size` ranks, this one `rank`-th among them."""

    group: object  # torch.distributed ProcessGroup
    size: int
    rank: int


@dataclass
class _Call:
    """What one sharded forward hands every attention layer (through the model's kwargs, so that a
    layer recomputed by gradient checkpointing during backward sees it too)."""

    sp: SequenceParallel
    position_ids: torch.Tensor  # [1, L'] the whole padded row's positions
    masks: dict = field(default_factory=dict)  # inner implementation -> its mask for the whole row


class _AllToAll(torch.autograd.Function):
    """all_to_all_single over dim 0 (one chunk per rank); its adjoint is the same exchange."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        return _exchange(x, group)

    @staticmethod
    def backward(ctx, grad):
        return _exchange(grad, ctx.group), None


def _exchange(x: torch.Tensor, group) -> torch.Tensor:
    # Both buffers contiguous: the collective reads and writes memory in order, and empty_like keeps a
    # permuted tensor's strides (a gradient arriving through a transpose has them).
    x = x.contiguous()
    out = torch.empty(x.shape, dtype=x.dtype, device=x.device)
    dist.all_to_all_single(out, x, group=group)
    return out


class _SumOverGroup(torch.autograd.Function):
    """all_reduce(SUM) in forward and in backward: each rank's loss is the group's, see the docstring."""

    @staticmethod
    def forward(ctx, x, group):
        ctx.group = group
        out = x.clone()
        dist.all_reduce(out, group=group)
        return out

    @staticmethod
    def backward(ctx, grad):
        grad = grad.clone()
        dist.all_reduce(grad, group=ctx.group)
        return grad, None


def seq_to_heads(tensors: list[torch.Tensor], sp: SequenceParallel) -> list[torch.Tensor]:
    """Each of `tensors` [B, h, L/S, D] (this rank's tokens, every head) -> [B, h/S, L, D] (every token, this
    rank's heads), in one all-to-all: one collective instead of three, and no reliance on autograd running
    three independent branches' backward exchanges in the same order on every rank (a mismatch would pair
    one rank's key gradients with another's value gradients, same sizes, so nothing would fail)."""
    s = sp.size
    b, _, ls, d = tensors[0].shape
    heads = [t.shape[1] // s for t in tensors]
    chunks = torch.cat([t.reshape(b, s, h, ls, d) for t, h in zip(tensors, heads)], 2)  # [B, S, sum h/S, L/S, D]
    got = _AllToAll.apply(chunks.transpose(0, 1).contiguous(), sp.group)  # chunk r: rank r's tokens
    whole = got.permute(1, 2, 0, 3, 4).reshape(b, sum(heads), s * ls, d)  # [B, sum h/S, L, D]
    return list(whole.split(heads, dim=1))


def heads_to_seq(x: torch.Tensor, sp: SequenceParallel) -> torch.Tensor:
    """[B, L, H/S, D] (an attention output: every token, this rank's heads) -> [B, L/S, H, D]."""
    b, length, hs, d = x.shape
    s = sp.size
    chunks = x.reshape(b, s, length // s, hs, d).transpose(0, 1)  # [S, B, L/S, H/S, D]: tokens of rank r
    got = _AllToAll.apply(chunks.contiguous(), sp.group)  # [S, B, L/S, H/S, D]: chunk r is rank r's heads
    return got.permute(1, 2, 0, 3, 4).reshape(b, length // s, s * hs, d)


def sequence_parallel_group(size: int) -> SequenceParallel | None:
    """This rank's group of `size` consecutive ranks (None for size 1). Every rank creates every group,
    in one order, as torch.distributed.new_group requires; FSDP2 still shards over the whole world."""
    if size == 1:
        return None
    world, rank = dist.get_world_size(), dist.get_rank()
    mine = None
    for first in range(0, world, size):
        group = dist.new_group(list(range(first, first + size)))
        if first <= rank < first + size:
            mine = SequenceParallel(group, size, rank - first)
    return mine


def kv_replicas(kv_heads: int, size: int) -> int:
    """How many copies of each KV head the split needs: 1 when S divides them, S / KV when KV divides S."""
    if kv_heads % size == 0:
        return 1
    if size % kv_heads == 0:
        return size // kv_heads
    raise ValueError(f"{kv_heads} key/value heads cannot be split over a sequence-parallel group of {size}: "
                     "ulysses_sequence_parallel_size must divide them or be a multiple of them")


class _LocalHeads:
    """The attention module as the inner implementation must see it: the inner config's name, and the
    query heads per KV head that this rank holds (they change when KV heads are replicated)."""

    def __init__(self, module, config, groups: int):
        self._module, self.config, self.num_key_value_groups = module, config, groups

    def __getattr__(self, name):
        return getattr(self._module, name)


def _inner_config(config, inner: str):
    local = copy.copy(config)
    local._attn_implementation = inner
    return local


def ulysses_attention(module, query, key, value, attention_mask, *, ulysses: _Call | None = None, **kwargs):
    """transformers' attention signature: query [B, H, L/S, D], key/value [B, KV, L/S, D] -> ([B, L/S, H, D], None)."""
    from transformers.masking_utils import create_causal_mask
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS

    if ulysses is None:
        raise RuntimeError("a model switched to Ulysses attention was called without models/ulysses.py sp_forward")
    if kwargs.get("sliding_window") is not None:
        raise NotImplementedError("sliding-window layers under sequence parallelism")
    sp = ulysses.sp
    inner = module.config._attn_implementation.removeprefix(PREFIX)
    if query.shape[1] % sp.size:
        raise ValueError(f"{query.shape[1]} attention heads cannot be split over {sp.size} sequence-parallel ranks")
    copies = kv_replicas(key.shape[1], sp.size)
    if copies > 1:  # KV head j serves query heads j*H/KV.. ; its copies go to the ranks holding those
        key, value = key.repeat_interleave(copies, dim=1), value.repeat_interleave(copies, dim=1)
    q, k, v = seq_to_heads([query, key, value], sp)
    config = _inner_config(module.config, inner)
    if inner not in ulysses.masks:  # once per forward: the same whole-row mask serves every layer
        shape_only = q.new_empty((q.shape[0], q.shape[2], 0))  # [B, L, 0]: the mask reads shape, dtype, device
        ulysses.masks[inner] = create_causal_mask(config=config, inputs_embeds=shape_only, attention_mask=None,
                                                  past_key_values=None, position_ids=ulysses.position_ids)
    kwargs["position_ids"] = ulysses.position_ids  # what flash-attention reads its sequence bounds from
    attend = ALL_ATTENTION_FUNCTIONS.get_interface(inner, None)
    local = _LocalHeads(module, config, q.shape[1] // k.shape[1])
    out, _ = attend(local, q, k, v, ulysses.masks[inner], **kwargs)  # [B, L, H/S, D]
    return heads_to_seq(out, sp), None


def use_ulysses(model: torch.nn.Module) -> str:
    """Switch `model` (any HF model or a peft wrapper of one) to Ulysses around the attention it was
    loaded with; returns the new implementation's name. Idempotent."""
    from transformers import AttentionInterface

    config = model.config
    inner = config._attn_implementation or "sdpa"
    if inner.startswith(PREFIX):
        return inner
    name = PREFIX + inner
    AttentionInterface.register(name, ulysses_attention)
    for module in model.modules():  # the root config and any sub-model's (they share one object in Qwen2)
        cfg = getattr(module, "config", None)
        if cfg is not None and getattr(cfg, "_attn_implementation", None) == inner:
            cfg._attn_implementation = name
    return name


def sp_range(length: int, sp: SequenceParallel) -> tuple[int, int]:
    """This rank's token range [start, stop) of a packed row of `length` tokens padded to a multiple of S."""
    per = -(-length // sp.size)
    return sp.rank * per, (sp.rank + 1) * per


def shard_row(input_ids: torch.Tensor, position_ids: torch.Tensor, sp: SequenceParallel):
    """[1, L] packed ids and positions -> this rank's [1, L'/S] of each, the whole padded row's positions
    [1, L'], and this rank's token range [start, stop) in it. L' is L rounded up to a multiple of S; the
    padding is a sequence of its own (positions 0, 1, ...), so no real token attends to it."""
    length = input_ids.shape[1]
    pad = -length % sp.size
    if pad:
        input_ids = torch.cat([input_ids, input_ids.new_zeros((1, pad))], 1)
        position_ids = torch.cat([position_ids, torch.arange(pad, device=position_ids.device)[None]], 1)
    start, stop = sp_range(length, sp)
    return input_ids[:, start:stop], position_ids[:, start:stop], position_ids, start, stop


def sp_forward(model, input_ids: torch.Tensor, position_ids: torch.Tensor, sp: SequenceParallel, **kwargs):
    """The model's forward on this rank's shard of a packed row ([1, L] ids and positions); returns
    (output, start, stop): the output covers the padded row's tokens [start, stop)."""
    ids, positions, full, start, stop = shard_row(input_ids, position_ids, sp)
    out = model(input_ids=ids, attention_mask=None, position_ids=positions, ulysses=_Call(sp, full), **kwargs)
    return out, start, stop


def gather_tokens(local: torch.Tensor, index: torch.Tensor, start: int, stop: int,
                  sp: SequenceParallel) -> torch.Tensor:
    """Per-token values of the packed positions `index` [M], each computed by the rank holding it.

    `local` is [n, ...]: the values at this rank's entries of `index` (those in [start, stop), in
    order). Returns [M, ...], the same on every rank of the group; differentiable (see the docstring)."""
    mine = ((index >= start) & (index < stop)).nonzero().squeeze(1)  # [n]
    full = local.new_zeros((index.shape[0], *local.shape[1:])).index_copy(0, mine, local)
    return _SumOverGroup.apply(full, sp.group)


def local_positions(index: torch.Tensor, start: int, stop: int) -> torch.Tensor:
    """The entries of packed positions `index` [M] that this rank holds, as indices into its shard [n]."""
    return index[(index >= start) & (index < stop)] - start
