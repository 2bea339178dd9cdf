"""`calc_gsm8k_reward`, the tool of verl's GSM8K multi-turn example (`Gsm8kTool`): the model submits
an answer, the tool says whether it matches the row's ground truth (from
`extra_info.tools_kwargs.calc_gsm8k_reward.create_kwargs.ground_truth`), in verl's words, so a verl
GSM8K tool run reads the same. The answer is verl's "flexible" extraction: the last number in it.
Stateless: verl's per-trajectory improvement reward (-0.05 when not better) is a tool reward
logicrl does not train on.
"""

from __future__ import annotations

import re
from typing import Any

from logicrl.tools.base import ToolResult, function_schema

_NUMBER = re.compile(r"(\-?[0-9\.\,]+)")
_CLIP = 300  # verl matches only the last 300 characters


def flexible_answer(text: str) -> str | None:
    """The last number in `text` that is not a lone '.', as verl's gsm8k.extract_solution(flexible)."""
    found = [n for n in _NUMBER.findall(text[-_CLIP:]) if n not in ("", ".")]
    return found[-1] if found else None


class Gsm8kTool:
    def __init__(self, config: dict[str, Any] | None = None, tool_schema: dict[str, Any] | None = None):
        self.schema = tool_schema or function_schema(
            "calc_gsm8k_reward", "A tool for calculating the reward of gsm8k. (1.0 if parsed answer is correct, "
            "0.0 if parsed answer is incorrect or not correctly parsed)",
            {"answer": {"type": "string", "description": "The model's answer to the GSM8K math problem, must be a "
                        "digits"}}, ["answer"])
        self.name = self.schema["function"]["name"]

    def call(self, arguments: dict[str, Any], ground_truth: str | None = None, **kwargs: Any) -> ToolResult:
        if ground_truth is None:
            return ToolResult.failure("missing_kwargs", f"{self.name} needs the row's tools_kwargs.{self.name}."
                                      "create_kwargs.ground_truth; this row has none")
        answer = str(arguments.get("answer", ""))
        parsed = flexible_answer(answer if answer.startswith("#### ") else "#### " + answer)
        reward = 0 if parsed is None else (1.0 if parsed == str(ground_truth) else 0.0)
        return ToolResult.success(f"Current parsed {answer=} {reward=}")
