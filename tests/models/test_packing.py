"""Packed sequences (use_remove_padding) give the padded path's log-probs, entropies, values and
gradients, on the trainer's layout: left-padded prompts, right-padded responses, positions cumsum-1.

Every model here is loaded as the trainer loads a packed one: with the kernel models/attention.py
chooses on this machine (on CPU the per-sequence SDPA; flash-attn varlen is CUDA-only: tests/gpu).
The kernel hands padded micro-batches to transformers' sdpa, so the padded passes are the padded path."""

import pytest
import torch
import transformers

from logicrl.models.attention import packed_attention
from logicrl.models.logprob import causal_lm_logprobs
from logicrl.models.packing import pack
from logicrl.workers.critic import response_values
from tests.models.conftest import trainer_batch
from tests.workers.conftest import build_tiny_qwen2

KERNEL = packed_attention(True, torch.device("cpu"), torch.float32)


def packed_model(model):
    model.set_attn_implementation(KERNEL)
    return model


def test_pack_hand_example():
    # Row 0: prompt [5] (padded to 2) + response [6, 7]; row 1: prompt [8, 9] + response [3] (+ pad).
    ids = torch.tensor([[0, 5, 6, 7], [8, 9, 3, 0]])
    mask = torch.tensor([[0, 1, 1, 1], [1, 1, 1, 0]])
    p = pack(ids, mask, (mask.cumsum(-1) - 1).clamp(min=0), response_len=2)
    assert p.input_ids.tolist() == [[5, 6, 7, 8, 9, 3]]
    assert p.position_ids.tolist() == [[0, 1, 2, 0, 1, 2]]
    # 6 is scored by 5 (packed 0), 7 by 6 (1), 3 by 9 (4); they sit at [0,0], [0,1], [1,0] of [2, 2].
    assert p.score_index.tolist() == [0, 1, 4]
    assert p.targets.tolist() == [6, 7, 3]
    assert p.response_index.tolist() == [0, 1, 2]
    assert p.unpack(torch.tensor([1.0, 2.0, 3.0])).tolist() == [[1.0, 2.0], [3.0, 0.0]]


# Prompt lengths up to the padded width, responses from 1 token to the full width.
PROMPTS, RESPONSES, P, R = [3, 7, 1, 5, 7], [6, 1, 9, 9, 4], 7, 9


def _policy_grads(model, remove_padding, weights):
    ids, mask, pos = trainer_batch(PROMPTS, RESPONSES, P, R)
    model.zero_grad(set_to_none=True)
    logp, ent = causal_lm_logprobs(model, ids, mask, pos, R, temperature=0.7, chunk_tokens=5, with_entropy=True,
                                   remove_padding=remove_padding)
    resp_mask = mask[:, P:].float()
    ((logp * weights + 0.3 * ent) * resp_mask).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    return logp.detach(), ent.detach(), resp_mask.bool(), grads


@pytest.mark.parametrize("checkpointing", [False, True])
def test_packed_logprobs_entropy_and_grads_equal_padded(checkpointing):
    model = packed_model(build_tiny_qwen2(seed=3))
    if checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    model.train()  # dropout is 0 in the tiny config; train mode is what the update runs
    weights = torch.randn(len(PROMPTS), R, generator=torch.Generator().manual_seed(2))
    lp_pad, ent_pad, mask, g_pad = _policy_grads(model, False, weights)
    lp_pack, ent_pack, _, g_pack = _policy_grads(model, True, weights)
    assert model.config._attn_implementation == KERNEL
    torch.testing.assert_close(lp_pack[mask], lp_pad[mask], atol=1e-5, rtol=0)
    torch.testing.assert_close(ent_pack[mask], ent_pad[mask], atol=1e-5, rtol=0)
    assert (lp_pack[~mask] == 0).all() and (ent_pack[~mask] == 0).all()
    assert g_pad.keys() == g_pack.keys()
    for name in g_pad:
        torch.testing.assert_close(g_pack[name], g_pad[name], atol=1e-5, rtol=0, msg=name)


def test_packed_logprobs_with_lora_equal_padded():
    peft = pytest.importorskip("peft")
    model = peft.get_peft_model(packed_model(build_tiny_qwen2(seed=4)), peft.LoraConfig(
        r=4, lora_alpha=8, target_modules=["q_proj", "v_proj"], lora_dropout=0.0, init_lora_weights=False))
    weights = torch.randn(len(PROMPTS), R, generator=torch.Generator().manual_seed(5))
    lp_pad, _, mask, g_pad = _policy_grads(model, False, weights)
    lp_pack, _, _, g_pack = _policy_grads(model, True, weights)
    torch.testing.assert_close(lp_pack[mask], lp_pad[mask], atol=1e-5, rtol=0)
    trained = [n for n, p in model.named_parameters() if p.requires_grad]
    assert trained and all("lora_" in n for n in trained)
    for name in trained:
        torch.testing.assert_close(g_pack[name], g_pad[name], atol=1e-5, rtol=0, msg=name)


def test_packed_values_and_grads_equal_padded():
    torch.manual_seed(6)
    config = build_tiny_qwen2().config
    config.num_labels = 1
    # eval: the value head's classifier dropout (0.1) would draw different masks in the two passes.
    critic = transformers.AutoModelForTokenClassification.from_config(config, attn_implementation=KERNEL).eval()
    ids, mask, pos = trainer_batch(PROMPTS, RESPONSES, P, R, seed=7)
    batch = {"input_ids": ids, "attention_mask": mask, "position_ids": pos, "responses": ids[:, P:]}
    resp_mask = mask[:, P:].bool()
    out = {}
    for packed in (False, True):
        critic.zero_grad(set_to_none=True)
        values = response_values(critic, batch, remove_padding=packed)
        (values.square() * resp_mask).sum().backward()
        out[packed] = values.detach(), {n: p.grad.clone() for n, p in critic.named_parameters()}
    torch.testing.assert_close(out[True][0][resp_mask], out[False][0][resp_mask], atol=1e-5, rtol=0)
    assert (out[True][0][~resp_mask] == 0).all()
    for name, grad in out[False][1].items():
        torch.testing.assert_close(out[True][1][name], grad, atol=1e-5, rtol=0, msg=name)


def test_forward_logprobs_packed_to_a_token_budget_equals_padded_fixed_rows():
    """old_log_prob / ref as the worker runs them: packed micro-batches dealt by a token budget come
    back in the batch's order, equal to padded fixed micro-batches at every real response token."""
    from tensordict import TensorDict

    from logicrl.workers.actor import forward_logprobs
    from logicrl.workers.oom import MicroSize

    model = packed_model(build_tiny_qwen2(seed=8)).eval()
    ids, mask, pos = trainer_batch(PROMPTS, RESPONSES, P, R, seed=9)
    batch = TensorDict({"input_ids": ids, "attention_mask": mask, "position_ids": pos, "responses": ids[:, P:]},
                       batch_size=[len(PROMPTS)])
    padded = forward_logprobs(model, batch, MicroSize("ref", "k", 2), 0.9)
    budget = MicroSize("ref", "k", 20, by_tokens=True)  # 52 real tokens: 3 micro-batches, rows dealt by length
    packed = forward_logprobs(model, batch, budget, 0.9, remove_padding=True)
    resp = mask[:, P:].bool()
    torch.testing.assert_close(packed[resp], padded[resp], atol=1e-5, rtol=0)
    assert (packed[~resp] == 0).all()
