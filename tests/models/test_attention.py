"""models/attention.py: the packed kernel attends within each sequence exactly as a block-diagonal
causal mask would, its gradients included, and keeps nothing quadratic in the packed row's length."""

import torch
import torch.nn.functional as F

from logicrl.memory.tracker import PeakTracker
from logicrl.models.attention import PACKED_SDPA, packed_attention, packed_cu_seqlens, packed_sdpa_attention
from logicrl.models.packing import pack
from tests.models.conftest import trainer_batch
from tests.workers.conftest import build_tiny_qwen2


class Layer(torch.nn.Module):  # what transformers' attention functions read off the module
    num_key_value_groups = 2
    is_causal = True


def test_cu_seqlens_from_restarting_positions():
    pos = torch.tensor([[0, 1, 2, 0, 1, 0, 1, 2, 3]])
    assert packed_cu_seqlens(pos).tolist() == [0, 3, 5, 9]
    assert packed_cu_seqlens(torch.tensor([[4, 5, 0, 1]])).tolist() == [0, 2, 4]  # a row starting mid-sequence


def _reference(q, k, v, lengths):
    """Dense SDPA over the whole row with the block-diagonal causal mask: what the kernel replaces."""
    doc = torch.repeat_interleave(torch.arange(len(lengths)), torch.tensor(lengths))
    mask = (doc[:, None] == doc[None, :]) & torch.ones(len(doc), len(doc), dtype=torch.bool).tril()
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=True).transpose(1, 2)


def test_kernel_equals_block_diagonal_sdpa_with_gradients():
    """4 query heads over 2 KV heads (GQA), sequences of 5, 1 and 7 tokens; bounds from the position ids
    and, as a sequence-parallel wrapper passes them, from cu_seq_lens_q."""
    lengths = [5, 1, 7]
    g = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(1, h, 13, 8, generator=g, dtype=torch.float64) for h in (4, 2, 2))
    pos = torch.cat([torch.arange(n) for n in lengths])[None]
    weights = torch.randn(1, 13, 4, 8, generator=g, dtype=torch.float64)
    expected_grads = None
    for kwargs in ({"position_ids": pos}, {"cu_seq_lens_q": packed_cu_seqlens(pos)}):
        inputs = [t.clone().requires_grad_() for t in (q, k, v)]
        out, weights_out = packed_sdpa_attention(Layer(), *inputs, None, **kwargs)
        assert weights_out is None and out.shape == (1, 13, 4, 8)
        ref_inputs = [t.clone().requires_grad_() for t in (q, k, v)]
        ref = _reference(*ref_inputs, lengths)
        torch.testing.assert_close(out, ref, atol=1e-12, rtol=0)
        (out * weights).sum().backward()
        (ref * weights).sum().backward()
        for mine, theirs in zip(inputs, ref_inputs):
            torch.testing.assert_close(mine.grad, theirs.grad, atol=1e-12, rtol=0)
        grads = [t.grad for t in inputs]
        if expected_grads is not None:
            assert all(torch.equal(a, b) for a, b in zip(grads, expected_grads))
        expected_grads = grads


def test_kernel_keeps_nothing_quadratic():
    """8192 tokens in 64 sequences, 2 heads of 8: a [L, L] bool mask alone would be 64 MiB; q, k, v,
    the output and their gradients are 0.5 MiB each in fp32. Forward and backward stay under 8 MiB."""
    lengths, heads, dim = [128] * 64, 2, 8
    tokens = sum(lengths)
    pos = torch.arange(128).repeat(64)[None]
    q, k, v = (torch.randn(1, heads, tokens, dim, requires_grad=True) for _ in range(3))
    with PeakTracker("cpu") as t:
        out, _ = packed_sdpa_attention(Layer(), q, k, v, None, position_ids=pos)
        out.sum().backward()
    assert t.peak_bytes - t.start_bytes < 8 * 2**20 < tokens * tokens


def _step_peak(name: str, rows: int) -> int:
    """Peak bytes a packed forward and backward of the tiny Qwen2 adds, rows of 64 + 64 tokens."""
    ids, mask, pos = trainer_batch([64] * rows, [64] * rows, 64, 64)
    packed = pack(ids, mask, pos, 64)
    model = build_tiny_qwen2(seed=1)
    model.set_attn_implementation(name)
    with PeakTracker("cpu") as t:
        model(input_ids=packed.input_ids, position_ids=packed.position_ids, use_cache=False,
              logits_to_keep=1).logits.sum().backward()
    return t.peak_bytes - t.start_bytes


def test_packed_model_memory_is_linear_in_tokens():
    """The tiny Qwen2 on 1,024 and 2,048 packed tokens: the chosen kernel's step doubles with the tokens
    (the weights' gradients, a constant, make it a little less: measured 1.95x); transformers' sdpa on the
    2,048-token row builds the [L, L] block-diagonal mask, 4 MiB as bool, and needs more than that beyond
    the kernel (measured 32 MiB more)."""
    kernel = packed_attention(True, torch.device("cpu"), torch.float32)
    assert kernel == PACKED_SDPA
    half, full = _step_peak(kernel, 8), _step_peak(kernel, 16)
    assert 1.8 * half < full <= 2 * half
    assert _step_peak("sdpa", 16) - full > 2048 * 2048
