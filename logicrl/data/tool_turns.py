"""A tool turn as token ids: what follows an assistant turn's end-of-turn token up to the next assistant turn.

    turns = ToolTurns(tokenizer)
    ids = turns.ids([{"role": "tool", "name": "calculator", "content": "42"}])
    turns = ToolTurns(tokenizer, assistant_opening="<answer>")   # and the next assistant turn opened with it

Only the tool messages are rendered, never the conversation so far: that part stays the ids the model
sampled (re-tokenizing it drifts, and re-rendering can rewrite it). The rendering is the chat template's
own: the template writes the conversation twice, once ending with an assistant message and once with the
tool messages and a generation prompt after it, and the text between the two is the tool turn, the
separator the template writes after the assistant's end-of-turn token included (a newline in ChatML; a
dropped separator is the drift users hit first). A template for which the first rendering is not a prefix
of the second (one that rewrites earlier turns once a tool answers) is refused in one line. An assistant
opening (multi_turn.assistant_opening) is text the next assistant message starts with, as a prompt can end
inside the first: it is the tool turn's last text, and the final conversation renders it as that message's start.
"""

from __future__ import annotations

from typing import Any

# Placeholders around which the template's own markup is read; never tokenized.
_SYSTEM, _USER, _REPLY = "\x00system\x00", "\x00user\x00", "\x00reply\x00"


class ChatTemplateError(ValueError):
    """A tokenizer whose chat template cannot render tool turns as an append-only suffix."""


class ToolTurns:
    def __init__(self, tokenizer: Any, assistant_opening: str = ""):
        if not getattr(tokenizer, "chat_template", None):
            raise ChatTemplateError("multi-turn rollouts render tool answers with the chat template, and this "
                                    "tokenizer has none: use a chat model's checkpoint")
        self.tokenizer, self.assistant_opening = tokenizer, assistant_opening
        self.base = [{"role": "system", "content": _SYSTEM}, {"role": "user", "content": _USER},
                     {"role": "assistant", "content": _REPLY}]
        self.base_text = tokenizer.apply_chat_template(self.base, tokenize=False)
        after = self.base_text.split(_REPLY, 1)[1]  # the assistant's end-of-turn token and the separator
        turn_end = self._end_of_turn(after)
        self.end_of_turn_id = tokenizer.convert_tokens_to_ids(turn_end)
        self.separator = after[len(turn_end):]
        self.ids([{"role": "tool", "name": "check", "content": "0"}])  # refuses a template that is not append-only
        # The ids that open an assistant turn (the generation prompt), to find a prompt's continued assistant message.
        asked = tokenizer.apply_chat_template(self.base[:2], tokenize=False, add_generation_prompt=True)
        plain = tokenizer.apply_chat_template(self.base[:2], tokenize=False)
        self.opening = tokenizer.encode(asked[len(plain):], add_special_tokens=False) if asked.startswith(plain) else []

    def _end_of_turn(self, after: str) -> str:
        ids = self.tokenizer.encode(after, add_special_tokens=False)
        if not ids or not after.startswith(self.tokenizer.convert_ids_to_tokens(ids[0])):
            raise ChatTemplateError(f"the chat template writes {after!r} after an assistant message, not an "
                                    "end-of-turn token the model can stop on: use a chat model's checkpoint")
        return self.tokenizer.convert_ids_to_tokens(ids[0])

    def continued(self, prompt_ids: list[int]) -> list[int]:
        """The ids of the assistant message a prompt ends inside (a prompt that continues the final assistant
        message, as the K&K templates open `<think>`): what follows the last assistant opening, [] when the prompt
        ends with the opening itself or has none. Calls written there belong to the first turn."""
        k = len(self.opening)
        for start in range(len(prompt_ids) - k, -1, -1):
            if k and prompt_ids[start:start + k] == self.opening:
                return prompt_ids[start + k:]
        return []

    def text(self, messages: list[dict]) -> str:
        """The tool turn as text: the separator after the assistant's end-of-turn token, the tool messages,
        the next assistant turn's opening (the template's generation prompt, then the assistant opening)."""
        full = self.tokenizer.apply_chat_template(self.base + messages, tokenize=False, add_generation_prompt=True)
        if not full.startswith(self.base_text):
            raise ChatTemplateError("the chat template rewrites earlier turns once a tool answers (the conversation "
                                    "rendered with a tool message does not start with its rendering without one): "
                                    "multi-turn rollouts need an append-only template")
        return self.separator + full[len(self.base_text):] + self.assistant_opening

    def ids(self, messages: list[dict]) -> list[int]:
        # The text starts right after a special token (end of turn), so tokenizing it alone gives the ids
        # it has inside the whole conversation.
        return self.tokenizer.encode(self.text(messages), add_special_tokens=False)


def truncate_text(text: str, limit: int, side: str) -> str:
    """At most `limit` characters of a tool's answer, as verl cuts it: keep the start (left), the end
    (right) or both ends (middle), with a marker where text was dropped."""
    if len(text) <= limit:
        return text
    if side == "left":
        return text[:limit] + "...(truncated)"
    if side == "right":
        return "(truncated)..." + text[-limit:]
    half = limit // 2
    return text[:half] + "\n...(truncated)...\n" + text[len(text) - (limit - half):]
