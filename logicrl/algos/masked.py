"""Masked reductions shared by the estimators, losses and metrics.

`mask` is [B, T] (bool, or 0/1 of any dtype) and marks the response tokens that count: the loss mask
(`response_mask`), which is the attention mask less what is attended but not trained. Values at
masked-out positions (padding, tool output, tokens after EOS) may be anything, inf and nan included,
and never change a result: every function selects with `torch.where` instead of multiplying by the
mask, because inf * 0 = nan would leak a padded garbage value into a sum. Outputs are 0 at masked
positions unless a docstring says otherwise.

An empty selection reduces to 0 rather than nan (a micro-batch of padding rows is legal).
"""

from __future__ import annotations

import torch


def as_bool_mask(mask: torch.Tensor) -> torch.Tensor:
    return mask if mask.dtype == torch.bool else mask != 0


def masked_fill_zero(x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
    """x where mask, else 0; gradients reach only the kept positions."""
    return torch.where(as_bool_mask(mask), x, torch.zeros((), dtype=x.dtype, device=x.device))


def masked_sum(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    x = masked_fill_zero(x, mask)
    return x.sum() if dim is None else x.sum(dim)


def masked_count(mask: torch.Tensor, dim: int | None = None, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    mask = as_bool_mask(mask).to(dtype)
    return mask.sum() if dim is None else mask.sum(dim)


def masked_mean(x: torch.Tensor, mask: torch.Tensor, dim: int | None = None) -> torch.Tensor:
    """Mean over the selected entries (along `dim`, or all of them); 0 where nothing is selected."""
    count = masked_count(mask, dim, x.dtype)
    return masked_sum(x, mask, dim) / count.clamp(min=1)


def masked_var(x: torch.Tensor, mask: torch.Tensor, unbiased: bool = True) -> torch.Tensor:
    """Variance of the selected entries, a 0-dim tensor. Bessel's correction when `unbiased`, as
    verl's masked_var; with one entry or none the variance is 0 (verl raises there, but a batch
    with one valid token is a legal degenerate case, not an error)."""
    count = masked_count(mask, None, x.dtype)
    mean = masked_mean(x, mask)
    sq_dev = masked_sum((x - mean) ** 2, mask)
    denom = count - 1 if unbiased else count
    return sq_dev / denom.clamp(min=1)


def masked_whiten(x: torch.Tensor, mask: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """(x - mean) / std over the selected entries, 0 at masked positions.

    Matches verl's masked_whiten (unbiased variance, rsqrt(var + 1e-8), mean shifted). When every
    selected entry is equal the result is exactly 0: (x - mean) can be a rounding error of ~1e-8,
    which rsqrt(1e-8) would blow up to ~1e-4 of noise.
    """
    mask = as_bool_mask(mask)
    mean = masked_mean(x, mask)
    whitened = (x - mean) * torch.rsqrt(masked_var(x, mask) + eps)
    big = torch.finfo(x.dtype).max
    constant = torch.where(mask, x, -big).max() <= torch.where(mask, x, big).min()
    return torch.where(mask & ~constant, whitened, torch.zeros((), dtype=x.dtype, device=x.device))


def response_lengths(attention_mask: torch.Tensor) -> torch.Tensor:
    """[B, T] response attention mask -> [B] int64: where each response ends, the index of its last
    attended token + 1 (0 for an empty one). This is the response's length for decoding, the reward's
    token (`lengths - 1`), the overlong penalty and the length metrics. It is read from the attention
    mask, never from the loss mask (`response_mask`): a span the model attends to but does not train
    on (tool output) lies inside the response and must neither shorten it nor move its reward."""
    columns = torch.arange(1, attention_mask.shape[-1] + 1, device=attention_mask.device)  # [T]
    return (as_bool_mask(attention_mask).long() * columns).amax(-1)
