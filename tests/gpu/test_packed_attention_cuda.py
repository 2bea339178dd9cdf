"""Packed attention on CUDA (models/attention.py): each kernel the trainer can choose gives the padded
log-probs (fp32 to 1e-4, bf16 within the bf16 bound), and the planner's packed attention term
(memory/footprint.py) holds against torch.cuda's allocator on a packed forward and backward.

Needs torch with CUDA and transformers only (no Ray, Hydra, vLLM or peft):
    python -m pytest -q -m gpu tests/gpu/test_packed_attention_cuda.py
flash-attn varlen is checked where the flash-attn package is installed; the per-sequence SDPA always.
"""

from __future__ import annotations

import importlib.metadata

import pytest

pytestmark = pytest.mark.gpu

torch = pytest.importorskip("torch")
if not torch.cuda.is_available():
    pytest.skip("needs CUDA", allow_module_level=True)

from logicrl.memory.footprint import saved_per_token_layer  # noqa: E402
from logicrl.models.attention import FLASH, PACKED_SDPA, register  # noqa: E402
from logicrl.models.logprob import causal_lm_logprobs  # noqa: E402
from logicrl.models.spec import ModelSpec  # noqa: E402

# bf16 keeps 8 significant bits (u = 2^-9 ~ 2e-3): two attention kernels on the same bf16 weights differ
# by a few u per token on average over 4 layers; attention leaking across the packed sequences, or a
# sequence cut short, changes log-probs by order 1.
MEAN_GAP, MAX_GAP = 0.02, 0.5
SHAPE = dict(hidden_size=512, num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=2, head_dim=64,
             intermediate_size=1408, vocab_size=4096, tie_word_embeddings=True)


def _flash_installed() -> bool:
    try:
        importlib.metadata.version("flash-attn")
    except importlib.metadata.PackageNotFoundError:
        return False
    return True


KERNELS = [PACKED_SDPA, pytest.param(FLASH, marks=pytest.mark.skipif(not _flash_installed(),
                                                                     reason="flash-attn is not installed"))]


def _batch(rows: int, p_width: int, r_width: int, seed: int = 0):
    """The trainer's layout (workers/hybrid.py): left-padded prompts, right-padded responses."""
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(p_width // 2, p_width + 1, (rows,), generator=g)
    responses = torch.randint(1, r_width + 1, (rows,), generator=g)
    ids = torch.zeros(rows, p_width + r_width, dtype=torch.long)
    mask = torch.zeros_like(ids)
    for i, (p, r) in enumerate(zip(prompts.tolist(), responses.tolist())):
        ids[i, p_width - p: p_width + r] = torch.randint(1, SHAPE["vocab_size"], (p + r,), generator=g)
        mask[i, p_width - p: p_width + r] = 1
    return [t.cuda() for t in (ids, mask, (mask.cumsum(-1) - 1).clamp(min=0))]


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["fp32", "bf16"])
def test_packed_logprobs_equal_padded_on_cuda(kernel, dtype):
    if kernel == FLASH and dtype == torch.float32:
        pytest.skip("flash-attn has no fp32 kernels (packed_kernel never picks it in fp32)")
    from transformers import AutoModelForCausalLM, Qwen2Config

    register()
    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_config(Qwen2Config(**SHAPE), dtype=dtype).cuda().eval()
    ids, mask, pos = _batch(12, 64, 192)
    resp = mask[:, 64:].bool()
    with torch.no_grad():
        model.set_attn_implementation("sdpa")
        padded, _ = causal_lm_logprobs(model, ids, mask, pos, 192)
        model.set_attn_implementation(kernel)
        packed, _ = causal_lm_logprobs(model, ids, mask, pos, 192, remove_padding=True)
    gap = (packed - padded)[resp].abs()
    if dtype == torch.float32:
        assert gap.max().item() < 1e-4, gap.max().item()
    else:
        assert gap.mean().item() < MEAN_GAP and gap.max().item() < MAX_GAP, (gap.mean().item(), gap.max().item())
    assert (packed[~resp] == 0).all()


@pytest.mark.parametrize("kernel", KERNELS)
def test_planned_attention_bytes_hold_on_cuda(kernel):
    """One Qwen2 attention block on a packed row of 64 sequences x 256 tokens (16,384) in bf16. After the
    forward autograd holds what footprint.saved_per_token_layer plans for attention when packed:
    q and K after RoPE, V and the output, 2 x (2 x 512 + 2 x 128) bytes a token, plus the fp32
    logsumexp per head (flash-attn keeps it; the per-sequence SDPA does not: 1% high), and the
    block's own output (o_proj's, hidden 512). Forward and backward peak under 4x that (the gradients
    of q, K, V, the output and the input come on top): a [L, L] bf16 mask alone would be 512 MiB,
    12x the planned 42 MiB."""
    from transformers import Qwen2Config
    from transformers.models.qwen2.modeling_qwen2 import Qwen2Attention, Qwen2RotaryEmbedding

    register()
    config = Qwen2Config(**SHAPE)
    config._attn_implementation = kernel
    torch.manual_seed(0)
    attention = Qwen2Attention(config, layer_idx=0).to("cuda", torch.bfloat16)
    rope = Qwen2RotaryEmbedding(config).cuda()
    tokens, b, h = 64 * 256, 2, SHAPE["hidden_size"]
    position_ids = torch.arange(256, device="cuda").repeat(64)[None]
    hidden = torch.randn(1, tokens, h, device="cuda", dtype=torch.bfloat16, requires_grad=True)
    cos_sin = rope(hidden, position_ids)
    spec = ModelSpec(name="test", model_type="qwen2", num_layers=1, hidden_size=h, num_heads=8, num_kv_heads=2,
                     head_dim=64, intermediate_size=SHAPE["intermediate_size"], vocab_size=SHAPE["vocab_size"],
                     max_position_embeddings=None, tie_word_embeddings=True, attention_bias=True)
    # The attention part of the packed per-token term: the whole term less what is not attention's
    # (the same call, padded at width 0, less padded attention's 4 x q + lse).
    q = 8 * 64
    planned_per_token = (saved_per_token_layer(spec, b, 0, packed=True) - saved_per_token_layer(spec, b, 0)
                         + 4 * b * q + 4 * 8)
    assert planned_per_token == b * (2 * q + 2 * 2 * 64) + 4 * 8
    torch.cuda.synchronize()
    start = torch.cuda.memory_allocated()
    torch.cuda.reset_peak_memory_stats()
    out, _ = attention(hidden, cos_sin, None, position_ids=position_ids)
    torch.cuda.synchronize()
    held = torch.cuda.memory_allocated() - start - tokens * h * b  # less the block's output
    planned = tokens * planned_per_token
    assert 0.9 * planned <= held <= 1.1 * planned, (held, planned)
    out.sum().backward()
    torch.cuda.synchronize()
    assert torch.cuda.max_memory_allocated() - start < 4 * planned, (torch.cuda.max_memory_allocated() - start, planned)
