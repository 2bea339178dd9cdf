"""DAPO's overlong reward shaping."""

from __future__ import annotations

import pytest
import torch

from logicrl.algos import overlong_penalty


def test_linear_penalty_inside_the_buffer():
    # max 10, buffer 4: free up to 6 tokens, then -1/4 per token, -1 at 10; past max stays -1.
    lengths = torch.tensor([0, 6, 7, 8, 10, 12])
    out = overlong_penalty(lengths, max_response_length=10, overlong_buffer_len=4)
    torch.testing.assert_close(out, torch.tensor([0.0, 0.0, -0.25, -0.5, -1.0, -1.0]))


def test_penalty_factor_scales_the_ramp():
    out = overlong_penalty(torch.tensor([7, 10]), max_response_length=10, overlong_buffer_len=4, penalty_factor=0.5)
    torch.testing.assert_close(out, torch.tensor([-0.125, -0.5]))


def test_a_buffer_as_long_as_the_response_ramps_from_zero():
    out = overlong_penalty(torch.tensor([5]), max_response_length=10, overlong_buffer_len=10)
    torch.testing.assert_close(out, torch.tensor([-0.5]))


@pytest.mark.parametrize("buffer_len", [0, 11])
def test_buffer_must_fit(buffer_len):
    with pytest.raises(ValueError, match="overlong_buffer.len"):
        overlong_penalty(torch.tensor([5]), max_response_length=10, overlong_buffer_len=buffer_len)
