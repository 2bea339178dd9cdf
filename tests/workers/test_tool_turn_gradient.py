"""A token sampled after a tool turn trains as it would in a single turn: its log-prob and its gradient, from
a multi-turn batch (prompt, a sampled turn, the tool turn attended but not trained, the sampled answer), equal
those from the same tokens as a single-turn batch whose prompt ends where the answer starts. Positions,
attention and packing over a tool span are what would silently stop learning across a tool turn."""

import pytest
import torch
from tensordict import TensorDict

from logicrl.models.attention import PACKED_SDPA, register
from logicrl.models.loading import load_causal_lm, load_tokenizer
from logicrl.workers.actor import response_logprobs

PROMPT = ("<|im_start|>user\nYou meet Noah, Oliver and David. Which one is Oliver? Look it up.<|im_end|>\n"
          "<|im_start|>assistant\n<answer><tool_call>x</tool_call></answer>")
TOOL_TURN = "\n<|im_start|>tool\nOliver is a knave.<|im_end|>\n<|im_start|>assistant\n"


def batch(tok, prompt: list[int], response: list[int], trained: list[int]) -> TensorDict:
    """Left-padded prompt, right-padded response (2 pad columns), as the worker lays a batch out."""
    pad = tok.pad_token_id
    ids = torch.tensor([[pad] * 3 + prompt + response + [pad] * 2])
    attention = torch.tensor([[0] * 3 + [1] * (len(prompt) + len(response)) + [0] * 2])
    width = len(response) + 2
    return TensorDict({"input_ids": ids, "attention_mask": attention,
                       "position_ids": (attention.cumsum(-1) - 1).clamp(min=0), "responses": ids[:, -width:],
                       "response_mask": torch.tensor([trained + [0, 0]])}, batch_size=[1])


@pytest.mark.parametrize("remove_padding", [False, True])
def test_the_answer_after_a_tool_turn_trains_as_in_a_single_turn(remove_padding):
    register()
    tok = load_tokenizer("embedded:tiny", quiet=True)
    model = load_causal_lm("embedded:tiny", torch.float32, attn_implementation=PACKED_SDPA)
    encode = lambda text: tok.encode(text, add_special_tokens=False)  # noqa: E731
    response = encode("<|im_end|>") + encode(TOOL_TURN) + encode("<think> Oliver is a knave")
    # Only the last token (the role) trains in both, so the two losses are the same function of the weights.
    multi = batch(tok, encode(PROMPT), response, [0] * (len(response) - 1) + [1])
    single = batch(tok, encode(PROMPT) + response[:-1], response[-1:], [1])
    results = []
    for b in (multi, single):
        model.zero_grad()
        log_probs, _ = response_logprobs(model, b, 1.0, with_entropy=True, remove_padding=remove_padding)
        picked = log_probs[b["response_mask"].bool()]
        picked.sum().backward()
        results.append((picked.detach(), torch.cat([p.grad.flatten() for p in model.parameters()])))
    (lp_multi, grad_multi), (lp_single, grad_single) = results
    torch.testing.assert_close(lp_multi, lp_single, atol=1e-5, rtol=0)
    assert grad_single.norm() > 0
    torch.testing.assert_close(grad_multi, grad_single, atol=1e-4, rtol=1e-4)
