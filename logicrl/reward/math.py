"""GSM8K-style math reward: the final answer, compared as a number.

Plays the role of verl's `verl/utils/reward_score/gsm8k.py` (and, for plain numeric answers, of its
`math.py`), with verl's signature and data_source names "openai/gsm8k", "gsm8k" and "math".

The final answer is whichever comes last: the rest of the line after the last `####` (GSM8K's
convention) or the contents of the last `\\boxed{...}` (nested braces matched). A last `\\boxed{` that
never closes (a truncated response) gives no answer rather than an earlier, tentative one. Commas,
`$`, LaTeX thin spaces, whitespace and a trailing period are ignored; integers, decimals, `a/b` and
`\\frac{a}{b}` are read exactly as fractions (`\\boxed{0.5}` matches `1/2`), and match within a relative
1e-6. When either side is not a number (`\\sqrt{2}`), the normalised strings must be equal.

Components: `format` 1.0 when an answer was extracted, `acc` 1.0 when it matches; score = acc. verl's
gsm8k gives wrong answers a format bonus (0.0 by default); it is reported here, never scored, so a
reward of 1 always means "right".
"""

from __future__ import annotations

import re
from fractions import Fraction
from typing import Any

REL_TOL = 1e-6
# Longer "numbers" are not answers; the cap also keeps Fraction() away from huge digit strings.
_MAX_NUMBER_CHARS = 64

_BOXED = re.compile(r"\\(?:boxed|fbox)\s*\{")
_DECIMAL = r"[+-]?(?:\d+(?:\.\d*)?|\.\d+)"
_NUMBER = re.compile(rf"({_DECIMAL})")
_RATIO = re.compile(rf"({_DECIMAL})/({_DECIMAL})")
_FRAC = re.compile(rf"([+-]?)\\[dt]?frac\{{({_DECIMAL})\}}\{{({_DECIMAL})\}}")
# Decorations that never change a number's value: thousands separators (also LaTeX's `{,}`),
# currency signs, LaTeX spacing commands and whitespace.
_NOISE = re.compile(r"\{,\}|\\[$,!; ]|[$,\s]")


def _last_boxed(text: str) -> tuple[int, str | None]:
    """(position, contents) of the last \\boxed{...}; (-1, None) if none, (pos, None) if unclosed."""
    last = None
    for last in _BOXED.finditer(text):  # noqa: B007 (the loop only leaves the last match behind)
        pass
    if last is None:
        return -1, None
    depth = 1
    for i in range(last.end(), len(text)):
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            depth -= 1
            if depth == 0:
                return last.start(), text[last.end() : i]
    return last.start(), None


def _last_hashes(text: str) -> tuple[int, str | None]:
    """(position, rest of the line) after the last `####`; (-1, None) if none."""
    pos = text.rfind("####")
    if pos < 0:
        return -1, None
    rest = text[pos + 4 :].split("\n", 1)[0].strip()
    return pos, rest or None


def extract_answer(text: str) -> str | None:
    """The final answer's text, from whichever of `####` and `\\boxed{}` comes last."""
    hashes_pos, hashes = _last_hashes(text)
    boxed_pos, boxed = _last_boxed(text)
    return hashes if hashes_pos > boxed_pos else boxed


def _normalise(text: str) -> str:
    # Then a sentence's final period, as in "#### 42.".
    return _NOISE.sub("", text).rstrip(".")


def parse_number(text: str) -> Fraction | None:
    """Exact value of `text` as written above, or None when it is not a number."""
    text = _normalise(text)
    if not text or len(text) > _MAX_NUMBER_CHARS:
        return None
    try:
        if match := _FRAC.fullmatch(text):
            value = Fraction(match.group(2)) / Fraction(match.group(3))
            return -value if match.group(1) == "-" else value
        if match := _RATIO.fullmatch(text):
            return Fraction(match.group(1)) / Fraction(match.group(2))
        if _NUMBER.fullmatch(text):
            return Fraction(text)
    except ZeroDivisionError:
        return None
    return None


def answers_match(predicted: str, truth: str) -> bool:
    """Numeric match within REL_TOL; exact normalised-string match when either is not a number."""
    p, t = parse_number(predicted), parse_number(truth)
    if p is None or t is None:
        if p is not None or t is not None:
            return False
        normalised = _normalise(predicted)
        return normalised != "" and normalised == _normalise(truth)
    # Relative to the larger magnitude, so a ground truth of 0 needs exactly 0.
    return abs(p - t) <= REL_TOL * max(abs(p), abs(t))


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None) -> dict[str, float]:
    """verl's signature; returns {"score": acc, "format", "acc"}.

    `ground_truth` is the answer itself ("72", "1/2", 0.5), as verl's GSM8K preprocessing
    stores it; `data_source` and `extra_info` are unused.
    """
    if ground_truth is None or isinstance(ground_truth, (dict, list, bool)) or not str(ground_truth).strip():
        raise ValueError(f"math ground truth must be the final answer, e.g. '72', got {ground_truth!r:.80}")
    if not isinstance(solution_str, str):
        solution_str = "" if solution_str is None else str(solution_str)
    answer = extract_answer(solution_str)
    acc = 1.0 if answer is not None and answers_match(answer, str(ground_truth)) else 0.0
    return {"score": acc, "format": 0.0 if answer is None else 1.0, "acc": acc}
