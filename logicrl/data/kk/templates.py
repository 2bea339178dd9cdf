"""Prompt templates, chosen by name (`--template`), each turning a puzzle into a chat list.

Both templates open the assistant's `<think>` in the prompt, as Logic-RL does, and the
builder records that as `reward_model.ground_truth.think_opened = True` so the reward counts
the opening tag as already written.

- `qwen-instruct`: [system, user, assistant] where the last message is the assistant turn
  already begun with content "<think>". A loader must render it with the tokenizer's chat
  template *continuing* that final message (transformers: `continue_final_message=True`,
  no generation prompt), so the model writes on straight after "<think>".
- `base`: Logic-RL's plain-text prompt for base models, "...User: <puzzle>\nAssistant: <think>".
  It is stored as a one-element list [{"role": "user", "content": <that whole text>}] so
  every row has the same `prompt` type, and the row carries `extra_info.template = "base"`:
  a loader must then use the content as the raw prompt and must not apply a chat template
  (which would wrap it in a second, conflicting turn structure).
"""

from __future__ import annotations

from collections.abc import Callable

THINK_OPEN = "<think>"

INSTRUCTIONS = (
    "The assistant first thinks about the reasoning process in the mind and then gives the "
    "user the answer. The reasoning process and the answer are enclosed within <think> </think> "
    "and <answer> </answer> tags, respectively, i.e., <think> reasoning process here </think>"
    "<answer> answer here </answer>. Now the user asks you to solve a logical reasoning problem. "
    "After thinking, when you finally reach a conclusion, clearly state the identity of each "
    "character within <answer> </answer> tags, one numbered line per character, i.e., "
    "<answer> (1) Zoey is a knight\n(2) Oliver is a knave\n... </answer>."
)

Message = dict[str, str]


def qwen_instruct(quiz: str) -> list[Message]:
    return [
        {"role": "system", "content": "You are a helpful assistant. " + INSTRUCTIONS},
        {"role": "user", "content": quiz},
        {"role": "assistant", "content": THINK_OPEN},
    ]


def base(quiz: str) -> list[Message]:
    text = (
        "A conversation between User and Assistant. The user asks a question, and the Assistant "
        f"solves it. {INSTRUCTIONS}\n\nUser: {quiz}\nAssistant: {THINK_OPEN}"
    )
    return [{"role": "user", "content": text}]


TEMPLATES: dict[str, Callable[[str], list[Message]]] = {
    "qwen-instruct": qwen_instruct,
    "base": base,
}

# Whether each template's prompt ends inside an opened <think> (see module docstring).
THINK_OPENED: dict[str, bool] = {"qwen-instruct": True, "base": True}


def apply_template(name: str, quiz: str) -> list[Message]:
    if name not in TEMPLATES:
        raise ValueError(f"template={name!r} is unknown; choose one of {sorted(TEMPLATES)}")
    return TEMPLATES[name](quiz)
