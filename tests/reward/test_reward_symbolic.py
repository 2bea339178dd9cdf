"""MATH-style answers scored by symbolic equivalence (reward/symbolic.py, math-verify): a hand-checked table
of equivalent and non-equivalent pairs, truncated responses, GSM8K's `####`, and a bounded pathological answer."""

import time

import pytest

from logicrl import reward
from logicrl.reward import symbolic

pytest.importorskip("math_verify", reason="math-verify is a dependency (pyproject.toml): make setup installs it")

RIGHT = {"score": 1.0, "format": 1.0, "acc": 1.0}
WRONG = {"score": 0.0, "format": 1.0, "acc": 0.0}
NO_ANSWER = {"score": 0.0, "format": 0.0, "acc": 0.0}


@pytest.mark.parametrize("response, truth", [
    ("\\boxed{\\frac{\\sqrt{3}}{2}}", "\\sqrt{3}/2"),  # fraction of a root, written two ways
    ("\\boxed{2\\sqrt{2}}", "\\sqrt{8}"),  # sqrt(8) = 2 sqrt(2)
    ("\\boxed{x=2}", "2"),  # an equation's right-hand side
    ("\\boxed{(x+1)^2}", "x^2+2x+1"),  # expanded
    ("\\boxed{[1,3)}", "[1,3)"),  # an interval
    ("\\boxed{\\{3,2,1\\}}", "\\{1,2,3\\}"),  # a set: order does not matter
    ("\\boxed{10\\text{ cm}}", "10"),  # a unit
    ("\\boxed{90^\\circ}", "90"),  # degrees
    ("\\boxed{\\dfrac{1}{2}}", "0.5"),
    ("\\boxed{\\boxed{\\frac{1}{2}}}", "1/2"),  # a box in a box
    ("The answer is $\\boxed{\\frac{3}{4}}$.", "0.75"),
    ("\\boxed{\\text{(B)}}", "B"),  # a multiple-choice letter
    ("\\boxed{\\infty}", "\\infty"),
    ("so the total is\n#### 72", "72"),  # GSM8K's convention, kept
])
def test_equivalent_answers_score_one(response, truth):
    assert reward.compute_score("math", response, truth) == RIGHT


@pytest.mark.parametrize("response, truth", [
    ("\\boxed{(1,3]}", "[1,3)"),  # the other end open
    ("\\boxed{(1,3)}", "[1,3)"),
    ("\\boxed{\\{1,2\\}}", "\\{1,2,3\\}"),  # a subset
    ("\\boxed{0.33}", "\\frac{1}{3}"),  # a rounding is not the value
    ("\\boxed{3.14}", "\\pi"),
    ("\\boxed{\\sqrt{3}}", "\\sqrt{2}"),
    ("\\boxed{-\\frac{1}{2}}", "\\frac{1}{2}"),  # the sign
    ("\\boxed{x=2}", "x=3"),
    ("\\boxed{10\\text{ m}}", "100"),  # a unit does not scale the number
    ("\\boxed{2} then, checking, \\boxed{3}", "2"),  # the last box is the answer
])
def test_non_equivalent_answers_keep_format_but_score_zero(response, truth):
    assert reward.compute_score("math", response, truth) == WRONG


@pytest.mark.parametrize("response", [
    "so the answer is \\boxed{\\frac{1}{2",  # cut off inside the box
    "\\boxed{1/2} hmm, no: \\boxed{\\frac{1",  # the last box unclosed: not the earlier one
    "The answer is 1/2.",  # no box, no ####
])
def test_truncated_or_unmarked_responses_have_no_answer(response):
    assert reward.compute_score("math", response, "1/2") == NO_ANSWER


@pytest.mark.parametrize("source", symbolic.SYMBOLIC_SOURCES)
def test_math_sources_compare_symbolically_and_gsm8k_by_number(source):
    assert reward.compute_score(source, "\\boxed{\\sqrt{3}/2}", "\\frac{\\sqrt{3}}{2}")["acc"] == 1.0
    # GSM8K's reward reads numbers only: its `#### 42 apples` is not 42 (reward/math.py).
    assert reward.compute_score("gsm8k", "#### 42 apples", "42")["acc"] == 0.0


def test_a_pathological_answer_returns_within_the_timeout():
    # 9^(9^(9^9)) has about 10^(3.7e8) digits: sympy would compute it for hours. Two parses and at most
    # four comparisons, each capped at TIMEOUT_S (module docstring).
    start = time.monotonic()
    assert reward.compute_score("math", "\\boxed{9^{9^{9^{9}}}}", "1") == WRONG
    assert time.monotonic() - start < 6 * symbolic.TIMEOUT_S + 1
