"""Reward shaping on response length."""

from __future__ import annotations

import torch


def overlong_penalty(
    response_lengths: torch.Tensor,  # [B] valid tokens per response (int or float)
    max_response_length: int,
    overlong_buffer_len: int,
    penalty_factor: float = 1.0,
) -> torch.Tensor:  # [B] float, in [-penalty_factor, 0]
    """DAPO's soft overlong punishment (Yu et al. 2025, arXiv:2503.14476, eq. 13), added to the
    sequence reward:

        0                                        if L <= max - buffer
        -factor * (L - (max - buffer)) / buffer  if max - buffer < L <= max
        -factor                                  if L > max

    A linear ramp over the last `overlong_buffer_len` tokens, so truncated answers are discouraged
    smoothly rather than by a cliff at max_response_length. verl's DAPO reward manager applies the
    same ramp; it does not cap past max, but generation truncates there, so only the paper's
    "> max" case differs and it cannot occur in a rollout.
    """
    if overlong_buffer_len < 1 or overlong_buffer_len > max_response_length:
        raise ValueError(
            f"overlong_buffer.len={overlong_buffer_len} must be in [1, max_response_length={max_response_length}]; "
            "turn overlong shaping off instead of setting a zero buffer"
        )
    expected = max_response_length - overlong_buffer_len
    exceed = (response_lengths.to(torch.float32) - expected).clamp(0, overlong_buffer_len)
    return -penalty_factor * exceed / overlong_buffer_len
