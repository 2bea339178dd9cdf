"""Knights-and-Knaves rule reward, with Logic-RL's semantics (Xie et al. 2025, arXiv:2502.14768;
`verl/utils/reward_score/kk.py` of github.com/Unakar/Logic-RL).

    format  +1   <think>, </think>, <answer>, </answer> each exactly once, in that order; else -1
    answer  +2   every role right; -1.5 parses but a role is wrong; -2 unparseable, or the format failed

so a score is 3, -0.5, -1 or -3. An answer parses when its "knight"/"knave" substring count equals the
number of people and every name is matched by `<Name> is a knight|knave` (case-insensitive).
Departures from Logic-RL (docs/configuration.md says why for each): `solution_str` is the response
alone, the template's opened `<think>` taken from ground_truth["think_opened"]; a dict of components
(format, answer, acc, format_ok) is returned and nothing printed; `format_ok` replaces Logic-RL's
format_error_ratio, which counted score == -1 (unparseable, not malformed); an unreadable ground truth
raises ValueError: a data bug scored silently would train on -2 forever.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any

FORMAT_OK_REWARD = 1.0
FORMAT_ERROR_REWARD = -1.0
ANSWER_CORRECT_REWARD = 2.0
ANSWER_WRONG_REWARD = -1.5
ANSWER_UNPARSED_REWARD = -2.0

THINK_OPEN = "<think>"
THINK_CLOSE = "</think>"
ANSWER_OPEN = "<answer>"
ANSWER_CLOSE = "</answer>"
# Required order. No tag is a substring of another, so str.count/find see each one cleanly.
TAGS = (THINK_OPEN, THINK_CLOSE, ANSWER_OPEN, ANSWER_CLOSE)

# "(1) Zoey is a knight": the builder's solution line (logicrl.data.kk.render). Stricter than
# Logic-RL, which takes the first word before "knight|knave", so that a change in the builder's
# wording fails loudly here instead of yielding wrong names. ASCII names only, as the builder's
# name list and Logic-RL's `[A-Za-z]+` both assume.
_TRUTH_LINE = re.compile(
    r"^\s*(?:\(\d+\)\s*)?([A-Za-z]+)\s+is\s+a\s+(knight|knave)\b[\s.]*$", re.IGNORECASE | re.ASCII
)
_ROLE_WORD = re.compile(r"knight|knave", re.IGNORECASE)


def parse_solution_text(solution_text: str) -> dict[str, str]:
    """Ground truth "(1) Zoey is a knight\\n(2) Oliver is a knave" -> {"Zoey": "knight", ...}.

    Raises ValueError on anything else (see the module docstring); the loader can call this to
    validate rows before training.
    """
    if not isinstance(solution_text, str):
        raise ValueError(f"K&K ground truth solution_text_format must be a str, got {type(solution_text).__name__}")
    roles: dict[str, str] = {}
    seen: set[str] = set()
    for line in solution_text.splitlines():
        if not line.strip():
            continue
        match = _TRUTH_LINE.match(line)
        if match is None:
            raise ValueError(f"K&K ground truth line {line!r} does not read '(k) <Name> is a knight|knave'")
        name, role = match.group(1), match.group(2).lower()
        # Answers are matched case-insensitively, so "Zoey" and "zoey" would be one person.
        if name.lower() in seen:
            raise ValueError(f"K&K ground truth names {name!r} twice: {solution_text!r}")
        seen.add(name.lower())
        roles[name] = role
    if not roles:
        raise ValueError(f"K&K ground truth names nobody: {solution_text!r}")
    return roles


def format_ok(response: str) -> bool:
    """Each tag exactly once, in the order <think> </think> <answer> </answer>."""
    positions = []
    for tag in TAGS:
        if response.count(tag) != 1:
            return False
        positions.append(response.find(tag))
    return positions == sorted(positions)


def extract_answer(response: str) -> str | None:
    """Text between the last <answer> and </answer>; None if there is no such pair.

    Only called after `format_ok`, where the last pair is the only one.
    """
    end = response.rfind(ANSWER_CLOSE)
    if end < 0:
        return None
    start = response.rfind(ANSWER_OPEN, 0, end)
    if start < 0:
        return None
    return response[start + len(ANSWER_OPEN) : end]


def parse_answer(answer_text: str, names: list[str]) -> dict[str, str] | None:
    """{name: role} for every name, or None when the answer does not parse."""
    if len(_ROLE_WORD.findall(answer_text)) != len(names):
        return None
    predicted = {}
    for name in names:
        # First statement about this person wins; with the count check above, a second one
        # about the same person would leave someone else unnamed or over-count.
        match = re.search(rf"\b{re.escape(name)}\b\s+is\s+a\s+(knight|knave)\b", answer_text, re.IGNORECASE)
        if match is None:
            return None
        predicted[name] = match.group(1).lower()
    return predicted


def compute_score(
    data_source: str, solution_str: str, ground_truth: Mapping[str, Any], extra_info: Any = None
) -> dict[str, float]:
    """verl's signature; returns {"score", "format", "answer", "acc", "format_ok"}.

    `ground_truth` is the row's reward_model.ground_truth: {"solution_text_format": str,
    "think_opened": bool, ...}. A missing `think_opened` means the prompt opened nothing.
    `data_source` and `extra_info` are unused: one K&K reward for every split.
    """
    if not isinstance(ground_truth, Mapping) or "solution_text_format" not in ground_truth:
        raise ValueError(f"K&K ground truth must be a mapping with 'solution_text_format', got {ground_truth!r:.200}")
    truth = parse_solution_text(ground_truth["solution_text_format"])

    # Totality: the reward manager hands us decoded text, but a None or non-str must still score.
    if not isinstance(solution_str, str):
        solution_str = "" if solution_str is None else str(solution_str)
    response = THINK_OPEN + solution_str if bool(ground_truth.get("think_opened", False)) else solution_str

    well_formed = format_ok(response)
    answer_reward = ANSWER_UNPARSED_REWARD
    if well_formed:
        predicted = parse_answer(extract_answer(response) or "", list(truth))
        if predicted is not None:
            answer_reward = ANSWER_CORRECT_REWARD if predicted == truth else ANSWER_WRONG_REWARD

    format_reward = FORMAT_OK_REWARD if well_formed else FORMAT_ERROR_REWARD
    return {
        "score": format_reward + answer_reward,
        "format": format_reward,
        "answer": answer_reward,
        "acc": 1.0 if answer_reward == ANSWER_CORRECT_REWARD else 0.0,
        "format_ok": 1.0 if well_formed else 0.0,
    }
