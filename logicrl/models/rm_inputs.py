"""Rows for a reward model whose tokenizer is not the actor's: decoded, re-rendered, re-tokenised.

    if not same_tokenizer(actor_tokenizer, rm_tokenizer):
        rows = retokenize(prompts, responses, response_attention_mask, actor_tokenizer, rm_tokenizer, max_length)
        scores = score_rows(model, rows.input_ids, rows.attention_mask, rows.position_ids, micro)

As verl's RewardModelWorker._switch_chat_template: each response's real tokens are decoded with the
actor's tokenizer, the eos text removed, appended to the prompt's chat as the assistant's turn,
rendered with the reward model's template (no generation prompt) and tokenized without added specials.
Departures (docs/configuration.md): the same tokenizer keeps the actor's rows as they are; a chat that
ends with an assistant message (K&K's opened <think>) is continued, not given a second turn; a row over
max_length keeps its LAST tokens (the score is read at the last one; how many were cut is returned); a
plain-string prompt is tokenized as text, and a tokenizer without a chat template gets "Role: content"
lines, as data/prompts.py renders prompts.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import torch


@dataclass(frozen=True)
class RewardInputs:
    input_ids: torch.Tensor  # [B, T] right-padded
    attention_mask: torch.Tensor  # [B, T]
    position_ids: torch.Tensor  # [B, T] 0.. over each row's real tokens
    truncated: int  # rows longer than max_length, cut to their last max_length tokens


def same_tokenizer(a: Any, b: Any) -> bool:
    """Whether `a` and `b` turn the same chat into the same tokens: one vocabulary, one chat template."""
    return (a.get_vocab() == b.get_vocab() and getattr(a, "chat_template", None) == getattr(b, "chat_template", None)
            and a.eos_token == b.eos_token)


def response_text(response: torch.Tensor, attention_mask: torch.Tensor, tokenizer: Any) -> str:
    """One response's tokens [R] decoded, its eos text removed (it ends the actor's turn, not the text).
    `attention_mask` [R] is the response's attention mask: the reward model reads the whole response,
    tool output included, not only the tokens that train."""
    text = tokenizer.decode(response[attention_mask.bool()].tolist(), skip_special_tokens=False)
    return text.replace(tokenizer.eos_token, "") if tokenizer.eos_token else text


def render(prompt: str | list[dict], response: str, tokenizer: Any) -> tuple[str, bool]:
    """(text, add_special_tokens): the prompt answered by `response`, as the reward model reads it."""
    if isinstance(prompt, str):
        return prompt + response, True
    chat = [dict(m) for m in prompt]
    if chat[-1]["role"] == "assistant":
        chat[-1]["content"] += response
    else:
        chat.append({"role": "assistant", "content": response})
    if getattr(tokenizer, "chat_template", None):
        return tokenizer.apply_chat_template(chat, tokenize=False, add_generation_prompt=False), False
    return "\n".join(f"{m['role'].capitalize()}: {m['content']}" for m in chat), True


def retokenize(prompts: list[str | list[dict]], responses: torch.Tensor, response_attention_mask: torch.Tensor,
               actor_tokenizer: Any, rm_tokenizer: Any, max_length: int) -> RewardInputs:
    """Each row's prompt (the dataset's chat list or string) and response [B, R] (the actor's tokens,
    right-padded; response_attention_mask [B, R] marks the real ones) as reward-model rows of at most max_length
    tokens."""
    rows, truncated = [], 0
    for prompt, response, mask in zip(prompts, responses, response_attention_mask):
        text, add_special = render(prompt, response_text(response, mask, actor_tokenizer), rm_tokenizer)
        ids = rm_tokenizer(text, add_special_tokens=add_special)["input_ids"]
        truncated += len(ids) > max_length
        rows.append(ids[-max_length:])
    width = max(len(ids) for ids in rows)
    pad = rm_tokenizer.pad_token_id if rm_tokenizer.pad_token_id is not None else 0
    input_ids = torch.full((len(rows), width), pad, dtype=torch.long)
    attention_mask = torch.zeros((len(rows), width), dtype=torch.long)
    for i, ids in enumerate(rows):
        input_ids[i, :len(ids)] = torch.tensor(ids, dtype=torch.long)
        attention_mask[i, :len(ids)] = 1
    position_ids = (attention_mask.cumsum(-1) - 1).clamp(min=0)
    return RewardInputs(input_ids.to(responses.device), attention_mask.to(responses.device),
                        position_ids.to(responses.device), truncated)
