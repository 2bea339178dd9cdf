"""A row's prompt as the text the model is given, and whether the tokenizer should add its specials.

Three ways, picked per row (one file may mix chat lists and strings):
- chat template: a chat list and a tokenizer with a template. A final assistant message (the K&K
  templates open `<think>` there) is continued, not closed; otherwise a generation prompt is added.
- raw: a plain string, or `extra_info.template == "base"` (Logic-RL's base-model prompt, a one-message
  list already ending in "Assistant: <think>"): the text as it is, a list's contents joined by
  newlines. A chat template would wrap it in a second, conflicting turn structure.
- plain: a chat list and a tokenizer without a template: "Role: content" lines, and a final
  "Assistant:" line when the list does not end with the assistant (the space after the colon left
  to the model, as Logic-RL's base prompt leaves it in front of `<think>`).

A chat template writes the model's special tokens itself, so its text is tokenized without adding any
(as verl does; a BOS would otherwise come twice); raw and plain text get the tokenizer's usual specials.
"""

from __future__ import annotations

import json
from typing import Any


def message_problem(messages: list) -> str | None:
    """What makes `messages` an invalid chat list, or None if it is a valid one."""
    if not messages:
        return "prompt is an empty chat list"
    for i, message in enumerate(messages):
        if not isinstance(message, dict):
            return f"prompt message {i} is {type(message).__name__}, expected a {{role, content}} mapping"
        for field in ("role", "content"):
            if not isinstance(message.get(field), str):
                what = "has no" if message.get(field) is None else f"has a non-string ({type(message[field]).__name__})"
                return f"prompt message {i} {what} '{field}'"
    return None


def text_problem(prompt: str) -> str | None:
    """What makes a string prompt unusable, or None: empty, or a chat list stored as JSON text (a
    parquet column written from json.dumps), which would be trained on as literal brackets and quotes
    and never reach the chat template."""
    if not prompt.strip():
        return "prompt is an empty string"
    text = prompt.strip()
    if not (text.startswith("[") and text.endswith("]")):
        return None
    try:
        messages = json.loads(text)
    except json.JSONDecodeError:
        return None
    if isinstance(messages, list) and messages and message_problem(messages) is None:
        return (f"prompt is a string holding a JSON chat list ({text[:40]!r}...), which would be trained on as "
                "literal text: store the list itself (json.loads the column before writing the file)")
    return None


def render_prompt(prompt: str | list[dict], tokenizer: Any, extra_info: dict,
                  tools: list[dict] | None = None) -> tuple[str, bool]:
    """(text, add_special_tokens) for a validated prompt; see the module docstring. `tools`: the OpenAI function
    schemas of a multi-turn run's tools, which a chat template lists for the model (Qwen's, in the system turn)."""
    if isinstance(prompt, str):
        return prompt, True
    if extra_info.get("template") == "base":
        return "\n".join(m["content"] for m in prompt), True
    continues = prompt[-1]["role"] == "assistant"
    if getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(prompt, tokenize=False, continue_final_message=continues,
                                             add_generation_prompt=not continues, **({"tools": tools} if tools else {}))
        return text, False
    lines = [f"{m['role'].capitalize()}: {m['content']}" for m in prompt]
    return "\n".join(lines if continues else [*lines, "Assistant:"]), True
