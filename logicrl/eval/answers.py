"""The answer a response gives, as a vote for maj@k: equal answers must compare equal.

Read with the same extraction as the reward that scores the data_source, so a vote counts what the
reward read: K&K's parsed roles (only from a well-formed response, as the reward requires), the recall
task's first word, the math rewards' final answer (a number in lowest terms where it is one, so `0.5`,
`1/2` and `\\frac{1}{2}` are one vote; other answers as written, spaces dropped, so two symbolically
equivalent forms are two votes). A data_source with no known extraction (a custom reward) votes with the
whole stripped response. None: nothing extracted, no vote.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from logicrl.data.role_task import answer_word
from logicrl.reward import kk, symbolic
from logicrl.reward import math as math_reward

MATH_SOURCES = ("openai/gsm8k", "gsm8k", *symbolic.SYMBOLIC_SOURCES)


def _kk(response: str, ground_truth: Any) -> str | None:
    if not isinstance(ground_truth, Mapping) or "solution_text_format" not in ground_truth:
        return None
    if ground_truth.get("think_opened", False):
        response = kk.THINK_OPEN + response
    if not kk.format_ok(response):
        return None
    names = list(kk.parse_solution_text(ground_truth["solution_text_format"]))
    roles = kk.parse_answer(kk.extract_answer(response) or "", names)
    return None if roles is None else ", ".join(f"{name.lower()}={roles[name]}" for name in sorted(names))


def _math(response: str) -> str | None:
    answer = math_reward.extract_answer(response)
    if answer is None:
        return None
    number = math_reward.parse_number(answer)
    if number is not None:
        return str(number)  # Fraction's lowest terms: "1/2", "72"
    return "".join(answer.split()) or None


def extract(data_source: str, response: str, ground_truth: Any) -> str | None:
    """`response`'s answer for a vote, read as data_source's reward reads it (module docstring)."""
    response = "" if response is None else str(response)
    if data_source == "kk_logic":
        return _kk(response, ground_truth)
    if data_source == "kk_role":
        return answer_word(response) or None
    if data_source in MATH_SOURCES:
        return _math(response)
    return response.strip() or None
