"""MATH-style reward: the final answer compared by symbolic equivalence, with Hugging Face's math-verify.

The data sources of MATH-style sets (SYMBOLIC_SOURCES: verl's "math" and the MATH, MATH-500 names) are
scored here; GSM8K's stay on reward/math.py, whose answers are numbers after `####`. The final answer is
extracted as reward/math.py does (the later of the last `####` line and the last `\\boxed{}`, nested
braces matched, an unclosed box none), so both rewards agree on what was answered; the two are then
equal when they are the same number (reward/math.py, exact and fast) or when math-verify's verifier
finds them equivalent: `\\frac{\\sqrt{3}}{2}` and `\\sqrt{3}/2`, `x=2` and `2`, `[1,3)`, `\\{1,2,3\\}` and
`\\{3,2,1\\}`, `10\\text{ cm}` and `10`.

Bounded: math-verify's parser and each of its comparisons run under its own SIGALRM timeout of TIMEOUT_S
seconds (a nested power such as `9^{9^{9^{9}}}` would otherwise run sympy for hours), so a response costs
at most two parses and four comparisons, about 6 s. SIGALRM works in the main thread only: the trainer
scores rewards in the driver's main thread; elsewhere math-verify refuses and this reward raises.

Components as reward/math.py: `format` (an answer was extracted), `acc` (it is equivalent); score = acc.
"""

from __future__ import annotations

from typing import Any

from logicrl.reward import math as math_reward

SYMBOLIC_SOURCES = ("math", "lighteval/MATH", "DigitalLearningGmbH/MATH-lighteval", "HuggingFaceH4/MATH-500")
# Seconds per parse and per comparison (signal.alarm takes whole seconds). Answers that parse do so in
# milliseconds; the cap only ends pathological ones.
TIMEOUT_S = 1


def _as_latex(answer: str) -> str:
    """The answer in math mode, as math-verify's LaTeX extractor reads it (its own `$` signs dropped)."""
    return f"${answer.strip().strip('$')}$"


def answers_equivalent(predicted: str, truth: str) -> bool:
    """`predicted` means `truth`: the same number, or equivalent to math-verify (module docstring)."""
    if math_reward.answers_match(predicted, truth):
        return True
    try:
        from math_verify import parse, verify
    except ImportError:
        raise ImportError("the MATH-style reward needs math-verify: pip install 'math-verify[antlr4_9_3]>=0.9,<0.10' "
                          "(or make setup)") from None

    gold = parse(_as_latex(truth), parsing_timeout=TIMEOUT_S)
    answer = parse(_as_latex(predicted), parsing_timeout=TIMEOUT_S)
    # Empty when it did not parse (or timed out); a timed-out comparison is False.
    return bool(gold and answer and verify(gold, answer, timeout_seconds=TIMEOUT_S))


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None) -> dict[str, float]:
    """verl's signature; returns {"score": acc, "format", "acc"}. `ground_truth` is the final answer
    ("\\frac{1}{2}", "[1,3)", 0.5), as verl's MATH preprocessing stores it."""
    if ground_truth is None or isinstance(ground_truth, (dict, list, bool)) or not str(ground_truth).strip():
        raise ValueError(f"math ground truth must be the final answer, e.g. '\\frac{{1}}{{2}}', "
                         f"got {ground_truth!r:.80}")
    if not isinstance(solution_str, str):
        solution_str = "" if solution_str is None else str(solution_str)
    answer = math_reward.extract_answer(solution_str)
    acc = 1.0 if answer is not None and answers_equivalent(answer, str(ground_truth)) else 0.0
    return {"score": acc, "format": 0.0 if answer is None else 1.0, "acc": acc}
