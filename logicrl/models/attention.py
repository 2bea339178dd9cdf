"""The attention a packed micro-batch runs on (use_remove_padding): chosen here, and only here.

    name = packed_attention(remove_padding, device, compute_dtype)   # attn_implementation to load with
    kernel = packed_kernel(remove_padding, device.type, dtype_bytes)  # what the planner and the header say

A packed row ([1, L], models/packing.py) holds several sequences whose positions restart at 0; its
attention stays inside each sequence and its memory grows with the tokens, never with L^2:
"flash_attention_2" (flash-attn's varlen kernel, CUDA in bf16/fp16, where installed), else
"logicrl_packed_sdpa" (PACKED_SDPA): torch's SDPA on each sequence on its own, no mask tensor.
Not flex_attention: on this CPU build it has no backward (docs/memory.md, "Packed attention").
The Ulysses wrapper (models/ulysses.py) calls the chosen kernel on the full-length, head-sharded q/k/v
with cu_seq_lens from the full position_ids: one rank's shard alone does not say where sequences start.
"""

from __future__ import annotations

import importlib.metadata
import itertools
import weakref
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import torch

PACKED_SDPA = "logicrl_packed_sdpa"
FLASH = "flash_attention_2"
# What each kernel keeps, for the plan's header (config/summary.py) and docs/memory.md.
KERNEL_NOTES = {
    PACKED_SDPA: "torch SDPA per sequence of the packed row, no mask: linear in tokens",
    FLASH: "flash-attn varlen over cu_seqlens, no mask: linear in tokens",
}


def packed_kernel(remove_padding: bool, device: str, dtype_bytes: int) -> str | None:
    """The attn_implementation packed micro-batches run on: flash-attn varlen on CUDA in a half dtype
    where flash_attn is importable (it has no fp32 kernels), PACKED_SDPA everywhere else; None
    (transformers' default, sdpa with the padding mask) for padded ones. The planner calls this on
    the driver, so a driver without flash_attn plans PACKED_SDPA (the workers' kernel keeps no more)."""
    if not remove_padding:
        return None
    if device == "cuda" and dtype_bytes == 2 and _flash_attn_2_installed():
        return FLASH
    return PACKED_SDPA


def _flash_attn_2_installed() -> bool:
    """The flash-attn distribution, by name: flash-attn-4 installs a flash_attn namespace package too
    (flash_attn/cute, no varlen entry transformers' flash_attention_2 can call), so find_spec would
    say yes without it."""
    try:
        importlib.metadata.version("flash-attn")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


def packed_attention(remove_padding: bool, device: torch.device, compute_dtype: torch.dtype) -> str | None:
    """packed_kernel for a worker's device and compute dtype, registered with transformers: the
    attn_implementation to load a trained model with."""
    name = packed_kernel(remove_padding, device.type, compute_dtype.itemsize)
    if name == PACKED_SDPA:
        register()
    return name


# One packed row's bounds, derived once per forward: every layer is handed the same position_ids
# tensor, so a weak reference to it identifies the forward (recomputation under gradient checkpointing
# included) without keeping the tensor alive.
_last: tuple[weakref.ref | None, list[int]] = (None, [])


def packed_cu_seqlens(position_ids: torch.Tensor) -> torch.Tensor:
    """[1, L] positions restarting at 0 for each sequence -> [S + 1] int32 starts, L at the end
    (flash-attn's cu_seqlens)."""
    import torch

    pos = position_ids.reshape(-1)
    starts = (pos == 0).nonzero().reshape(-1)
    if starts.numel() == 0 or starts[0] != 0:  # a row that does not start a sequence still starts one
        starts = torch.cat([starts.new_zeros(1), starts])
    return torch.cat([starts, starts.new_full((1,), pos.numel())]).to(torch.int32)


def _bounds(length: int, cu_seq_lens_q: torch.Tensor | None, position_ids: torch.Tensor | None) -> list[int]:
    global _last
    if cu_seq_lens_q is not None:
        return cu_seq_lens_q.tolist()
    if position_ids is None:
        return [0, length]
    ref, bounds = _last
    if ref is not None and ref() is position_ids:
        return bounds
    bounds = packed_cu_seqlens(position_ids).tolist()
    _last = (weakref.ref(position_ids), bounds)
    return bounds


def _segments(q, k, v, bounds: list[int], scale: float | None, gqa: bool):
    """Causal SDPA of each sequence [bounds[i], bounds[i+1]) of [1, L, heads, D] q/k/v, in that layout."""
    import torch.nn.functional as F

    for s, e in itertools.pairwise(bounds):
        out = F.scaled_dot_product_attention(q[:, s:e].transpose(1, 2), k[:, s:e].transpose(1, 2),
                                             v[:, s:e].transpose(1, 2), is_causal=True, scale=scale, enable_gqa=gqa)
        yield s, e, out.transpose(1, 2)


def _function():
    import torch

    cpu_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu  # -> (output, logsumexp)
    cpu_flash_backward = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu_backward

    class PackedSDPA(torch.autograd.Function):
        """Per-sequence SDPA that keeps q, k and v for backward (and autograd keeps the output, o_proj's
        input, anyway). Letting autograd record each call would keep every sequence's output a second
        time beside the concatenated one: more per token than padded attention keeps.

        On CPU each sequence runs torch's flash kernel for CPU (what SDPA itself calls there) directly, and
        its logsumexp (fp32, one per head and token) is kept too, in one [1, heads, L] buffer: backward
        then calls the kernel's own backward per sequence, as SDPA's autograd does for a padded row,
        instead of running each sequence's attention forward again under autograd (one attention
        forward per layer and an autograd graph per sequence fewer; the plan counts the logsumexp on
        every device). Elsewhere (CUDA: several kernels, SDPA picks one) backward recomputes one
        sequence's attention at a time."""

        @staticmethod
        def forward(ctx, q, k, v, bounds, scale, gqa):
            out = q.new_empty(q.shape)
            ctx.bounds, ctx.scale, ctx.gqa = bounds, scale, gqa
            if q.device.type == "cpu":
                # The kernel's accumulation dtype: fp32, or fp64 for fp64 inputs.
                lse = q.new_empty((1, q.shape[2], q.shape[1]), dtype=torch.promote_types(q.dtype, torch.float32))
                for s, e in itertools.pairwise(bounds):
                    piece, lse[:, :, s:e] = cpu_flash(*(t[:, s:e].transpose(1, 2) for t in (q, k, v)), 0.0, True,
                                                      scale=scale)
                    out[:, s:e] = piece.transpose(1, 2)
                ctx.save_for_backward(q, k, v, out, lse)
                return out
            for s, e, piece in _segments(q, k, v, bounds, scale, gqa):
                out[:, s:e] = piece  # written in place: one sequence's output alive beside it, not all
            ctx.save_for_backward(q, k, v)
            return out

        @staticmethod
        def backward(ctx, grad):
            q, k, v, *kept = ctx.saved_tensors
            grads = [torch.empty_like(t) for t in (q, k, v)]
            for s, e in itertools.pairwise(ctx.bounds):
                if kept:  # CPU: the flash kernel's backward from the kept output and logsumexp
                    out, lse = kept
                    parts = cpu_flash_backward(*(t[:, s:e].transpose(1, 2) for t in (grad, q, k, v, out)),
                                               lse[:, :, s:e], 0.0, True, scale=ctx.scale)
                    parts = [part.transpose(1, 2) for part in parts]
                else:
                    with torch.enable_grad():
                        qkv = [t[:, s:e].detach().requires_grad_() for t in (q, k, v)]
                        _, _, piece = next(_segments(*qkv, [0, e - s], ctx.scale, ctx.gqa))
                        parts = torch.autograd.grad(piece, qkv, grad[:, s:e])
                for g, part in zip(grads, parts):
                    g[:, s:e] = part
            return *grads, None, None, None

    return PackedSDPA


_packed_sdpa = None


def packed_sdpa_attention(module: torch.nn.Module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                          attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                          sliding_window: int | None = None, cu_seq_lens_q: torch.Tensor | None = None,
                          position_ids: torch.Tensor | None = None, **kwargs) -> tuple[torch.Tensor, None]:
    """transformers' attention-function signature: query [B, H, L, D], key/value [B, Hkv, L, D] ->
    ([B, L, H, D], None). A padding mask (padded rows, generation) goes to transformers' own sdpa; one
    packed row runs causal SDPA on each sequence [cu[i], cu[i+1]), bounds from `cu_seq_lens_q` when
    given, else from `position_ids` (packed_cu_seqlens)."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    global _packed_sdpa
    if attention_mask is not None or query.shape[0] != 1 or query.shape[2] != key.shape[2]:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      position_ids=position_ids, **kwargs)
    if sliding_window is not None or dropout:
        raise ValueError(f"{PACKED_SDPA} has no sliding-window attention or attention dropout (this layer: window "
                         f"{sliding_window}, dropout {dropout}); set use_remove_padding=false for this model")
    _packed_sdpa = _packed_sdpa or _function()
    bounds = _bounds(query.shape[2], cu_seq_lens_q, position_ids)
    # [1, L, heads, D]: the layout the projections wrote (query is its transpose), and the output's.
    q, k, v = (t.transpose(1, 2) for t in (query, key, value))
    return _packed_sdpa.apply(q, k, v, bounds, scaling, key.shape[1] != query.shape[1]), None


def _packed_mask(*args, attention_mask: torch.Tensor | None = None, **kwargs):
    """The mask transformers builds for PACKED_SDPA: none for a packed row (its bounds come from the
    positions), sdpa's own padding mask otherwise."""
    from transformers.masking_utils import sdpa_mask

    if attention_mask is None:
        return None
    return sdpa_mask(*args, attention_mask=attention_mask, **kwargs)


def register() -> None:
    """Make PACKED_SDPA a transformers attn_implementation (idempotent, per process: each Ray worker
    calls it through packed_attention before loading)."""
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(PACKED_SDPA, packed_sdpa_attention)
    AttentionMaskInterface.register(PACKED_SDPA, _packed_mask)
