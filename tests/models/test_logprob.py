"""Chunked log-probs/entropy equal the naive full-logits computation, and never hold [N, V] fp32."""

import pytest
import torch
import transformers
from torch.utils._python_dispatch import TorchDispatchMode

from logicrl.models.logprob import causal_lm_logprobs, token_logprobs_and_entropy

TOL = dict(atol=1e-5, rtol=1e-5)


def naive(hidden, weight, bias, target, temperature):
    """The reference: whole [N, V] fp32 logits, autograd through log_softmax."""
    logits = torch.nn.functional.linear(hidden, weight, bias).float() / temperature  # [.., V]
    logp = torch.log_softmax(logits, dim=-1)
    entropy = -(logp.exp() * logp).sum(-1)
    return logp.gather(-1, target[..., None]).squeeze(-1), entropy


def leaves(n=37, h=16, v=300, bias=True, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, h, generator=g).requires_grad_()
    weight = (torch.randn(v, h, generator=g) * 0.5).requires_grad_()
    b = (torch.randn(v, generator=g) * 0.1).requires_grad_() if bias else None
    target = torch.randint(0, v, (n,), generator=g)
    return hidden, weight, b, target


def grads(loss, tensors):
    return torch.autograd.grad(loss, [t for t in tensors if t is not None])


@pytest.mark.parametrize("chunk_tokens", [1, 5, 16, 37, 64])  # 5 and 16 do not divide N=37
@pytest.mark.parametrize("temperature", [1.0, 0.6])
@pytest.mark.parametrize("bias", [False, True])
def test_values_and_gradients_match_naive(chunk_tokens, temperature, bias):
    hidden, weight, b, target = leaves(bias=bias)
    # Random cotangents so a wrong sign or a swapped term in either backward formula shows up.
    c_lp, c_ent = torch.randn(37, generator=torch.Generator().manual_seed(1)), torch.rand(37)
    lp, ent = token_logprobs_and_entropy(hidden, weight, target, bias=b, temperature=temperature,
                                         chunk_tokens=chunk_tokens, with_entropy=True)
    ref_lp, ref_ent = naive(hidden, weight, b, target, temperature)
    torch.testing.assert_close(lp, ref_lp, **TOL)
    torch.testing.assert_close(ent, ref_ent, **TOL)
    got = grads((lp * c_lp).sum() + (ent * c_ent).sum(), (hidden, weight, b))
    want = grads((ref_lp * c_lp).sum() + (ref_ent * c_ent).sum(), (hidden, weight, b))
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, **TOL)


def test_temperature_changes_the_distribution():
    hidden, weight, _, target = leaves(bias=False)
    lp_1, _ = token_logprobs_and_entropy(hidden, weight, target, temperature=1.0)
    lp_half, _ = token_logprobs_and_entropy(hidden, weight, target, temperature=0.5)
    torch.testing.assert_close(lp_half, naive(hidden, weight, None, target, 0.5)[0], **TOL)
    assert (lp_1 - lp_half).abs().max() > 0.1


def test_entropy_only_and_logprob_only_losses():
    hidden, weight, _, target = leaves(bias=False)
    # Only the entropy feeds the loss: the log-prob cotangent arrives as zeros.
    _, ent = token_logprobs_and_entropy(hidden, weight, target, chunk_tokens=8, with_entropy=True)
    _, ref_ent = naive(hidden, weight, None, target, 1.0)
    for g, w in zip(grads(ent.sum(), (hidden, weight)), grads(ref_ent.sum(), (hidden, weight)), strict=True):
        torch.testing.assert_close(g, w, **TOL)
    lp, none = token_logprobs_and_entropy(hidden, weight, target, chunk_tokens=8, with_entropy=False)
    assert none is None
    ref_lp, _ = naive(hidden, weight, None, target, 1.0)
    for g, w in zip(grads(lp.sum(), (hidden, weight)), grads(ref_lp.sum(), (hidden, weight)), strict=True):
        torch.testing.assert_close(g, w, **TOL)


def test_batched_shape_is_kept():
    g = torch.Generator().manual_seed(3)
    hidden = torch.randn(3, 5, 16, generator=g)  # [B, T, H]
    weight = torch.randn(50, 16, generator=g)  # [V, H]
    target = torch.randint(0, 50, (3, 5), generator=g)  # [B, T]
    lp, ent = token_logprobs_and_entropy(hidden, weight, target, chunk_tokens=4, with_entropy=True)
    assert lp.shape == ent.shape == (3, 5)
    ref_lp, ref_ent = naive(hidden, weight, None, target, 1.0)
    torch.testing.assert_close(lp, ref_lp, **TOL)
    torch.testing.assert_close(ent, ref_ent, **TOL)


def test_bf16_inputs_score_like_hf_lm_head_then_float():
    hidden, weight, _, target = leaves(bias=False)
    hidden = hidden.detach().bfloat16().requires_grad_()
    weight = weight.detach().bfloat16().requires_grad_()
    lp, ent = token_logprobs_and_entropy(hidden, weight, target, chunk_tokens=16, with_entropy=True)
    assert lp.dtype == ent.dtype == torch.float32
    ref_lp, ref_ent = naive(hidden, weight, None, target, 1.0)  # bf16 matmul, fp32 softmax
    torch.testing.assert_close(lp, ref_lp, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(ent, ref_ent, atol=1e-4, rtol=1e-4)
    g_hidden, g_weight = grads(lp.sum(), (hidden, weight))
    assert g_hidden.dtype == g_weight.dtype == torch.bfloat16
    w_hidden, w_weight = grads(ref_lp.sum(), (hidden, weight))
    torch.testing.assert_close(g_hidden, w_hidden, atol=2e-2, rtol=2e-2)
    torch.testing.assert_close(g_weight, w_weight, atol=2e-2, rtol=2e-2)


def test_rejects_bad_arguments():
    hidden, weight, _, target = leaves(bias=False)
    with pytest.raises(ValueError, match="chunk_tokens"):
        token_logprobs_and_entropy(hidden, weight, target, chunk_tokens=0)
    with pytest.raises(ValueError, match="temperature"):
        token_logprobs_and_entropy(hidden, weight, target, temperature=0.0)
    with pytest.raises(ValueError, match="target_ids"):
        token_logprobs_and_entropy(hidden, weight, target[:-1])


# --- memory: no [N, V] fp32 tensor exists at any point ---------------------------------------


class LargestTensor(TorchDispatchMode):
    """Records the largest tensor any aten op returns (forward and backward alike) and the op names."""

    def __init__(self):
        super().__init__()
        self.largest_bytes = 0
        self.ops: set[str] = set()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.ops.add(func.overloadpacket.__name__)
        for t in out if isinstance(out, (tuple, list)) else (out,):
            if isinstance(t, torch.Tensor):
                self.largest_bytes = max(self.largest_bytes, t.numel() * t.element_size())
        return out


def test_no_full_logits_in_forward_or_backward():
    n, h, v, chunk = 512, 32, 2048, 64
    hidden, weight, _, target = leaves(n=n, h=h, v=v, bias=False)
    full_logits_bytes = n * v * 4  # 4 MiB; a chunk of logits is 512 KiB, grad W 256 KiB

    with LargestTensor() as seen:
        lp, ent = token_logprobs_and_entropy(hidden, weight, target, chunk_tokens=chunk, with_entropy=True)
        (lp.sum() + ent.sum()).backward()
    assert "addmm_" in seen.ops  # the backward's weight-gradient accumulation was observed too
    assert seen.largest_bytes <= chunk * v * 4
    assert seen.largest_bytes * 4 <= full_logits_bytes

    # The tracker does see full logits when they exist, so the bound above is not vacuous.
    with LargestTensor() as naive_seen:
        ref_lp, ref_ent = naive(hidden, weight, None, target, 1.0)
        (ref_lp.sum() + ref_ent.sum()).backward()
    assert naive_seen.largest_bytes >= full_logits_bytes


# --- through a causal LM -----------------------------------------------------------------------


def tiny_qwen2(seed=0):
    torch.manual_seed(seed)
    config = transformers.Qwen2Config(hidden_size=128, num_hidden_layers=2, num_attention_heads=2,
                                      num_key_value_heads=1, head_dim=64, intermediate_size=352,
                                      vocab_size=2048, tie_word_embeddings=True)
    return transformers.AutoModelForCausalLM.from_config(config).eval()


def padded_batch(prompts, responses, pad_id=0):
    """Left-pad prompts, right-pad responses: input_ids/attention_mask/position_ids [B, P+R], R."""
    p = max(map(len, prompts))
    r = max(map(len, responses))
    ids, mask = [], []
    for prompt, response in zip(prompts, responses, strict=True):
        ids.append([pad_id] * (p - len(prompt)) + prompt + response + [pad_id] * (r - len(response)))
        mask.append([0] * (p - len(prompt)) + [1] * (len(prompt) + len(response)) + [0] * (r - len(response)))
    ids, mask = torch.tensor(ids), torch.tensor(mask)
    position_ids = (mask.cumsum(-1) - 1).clamp(min=0)
    return ids, mask, position_ids, r


def naive_causal(model, ids, mask, pos, r, temperature):
    logits = model(input_ids=ids, attention_mask=mask, position_ids=pos).logits.float() / temperature  # [B, T, V]
    logp = torch.log_softmax(logits[:, -r - 1:-1], dim=-1)  # position t scores token t+1
    entropy = -(logp.exp() * logp).sum(-1)
    return logp.gather(-1, ids[:, -r:, None]).squeeze(-1), entropy


def test_causal_lm_matches_full_forward_with_padding_and_gradients():
    model = tiny_qwen2()
    ids, mask, pos, r = padded_batch([[5, 9, 300, 7], [11, 12]], [[40, 41, 42, 1000, 3], [8, 9]])
    lp, ent = causal_lm_logprobs(model, ids, mask, pos, r, temperature=0.8, chunk_tokens=3, with_entropy=True)
    ref_lp, ref_ent = naive_causal(model, ids, mask, pos, r, 0.8)
    assert lp.shape == ent.shape == (2, 5)
    torch.testing.assert_close(lp, ref_lp, **TOL)
    torch.testing.assert_close(ent, ref_ent, **TOL)

    params = [model.model.embed_tokens.weight, model.model.layers[1].mlp.down_proj.weight]
    got = grads((lp * mask[:, -r:]).sum() + ent.mean(), params)
    want = grads((ref_lp * mask[:, -r:]).sum() + ref_ent.mean(), params)
    for g, w in zip(got, want, strict=True):
        torch.testing.assert_close(g, w, atol=1e-5, rtol=1e-4)


def test_shift_scores_each_token_from_the_position_before_it():
    model = tiny_qwen2()
    ids = torch.tensor([[3, 14, 15, 92, 65]])
    ones = torch.ones_like(ids)
    lp, _ = causal_lm_logprobs(model, ids, ones, torch.arange(5)[None], response_len=2)
    # Token 65 (position 4) is scored by the prefix [3, 14, 15, 92] alone.
    prefix_logits = model(input_ids=ids[:, :4]).logits[0, -1]
    torch.testing.assert_close(lp[0, 1], torch.log_softmax(prefix_logits, -1)[65], **TOL)


@pytest.mark.filterwarnings("ignore:Model has `tie_word_embeddings=True`:UserWarning")
def test_peft_wrapped_model_and_lora_on_lm_head_is_refused():
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(tiny_qwen2(), peft.LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"],
                                                              init_lora_weights=False))
    ids, mask, pos, r = padded_batch([[5, 9, 300], [11]], [[40, 41], [8, 9]])
    lp, _ = causal_lm_logprobs(model, ids, mask, pos, r)
    torch.testing.assert_close(lp, naive_causal(model, ids, mask, pos, r, 1.0)[0], **TOL)
    with model.disable_adapter():  # the LoRA reference policy: same call, adapter off
        lp_ref, _ = causal_lm_logprobs(model, ids, mask, pos, r)
        torch.testing.assert_close(lp_ref, naive_causal(model, ids, mask, pos, r, 1.0)[0], **TOL)
    assert (lp - lp_ref).abs().max() > 1e-3  # the adapter (non-zero init) really is in the first call

    head_lora = peft.get_peft_model(tiny_qwen2(), peft.LoraConfig(r=4, target_modules=["lm_head"]))
    with pytest.raises(TypeError, match="lm_head"):
        causal_lm_logprobs(head_lora, ids, mask, pos, r)


def test_response_len_must_leave_a_prompt_token():
    model = tiny_qwen2()
    ids = torch.tensor([[1, 2, 3]])
    with pytest.raises(ValueError, match="response_len"):
        causal_lm_logprobs(model, ids, torch.ones_like(ids), torch.arange(3)[None], response_len=3)
