"""Math (GSM8K-style) reward: extraction, numeric comparison, and totality."""

from fractions import Fraction

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logicrl.reward import math as math_reward


def score(response, truth):
    return math_reward.compute_score("openai/gsm8k", response, truth)


@pytest.mark.parametrize(
    "response, truth",
    [
        ("so the total is\n#### 1,234", "1234"),  # thousands separator
        ("#### $1,234.", "1234"),  # currency and a sentence's period
        ("#### 42", 42),  # ground truth given as a number
        ("#### -7", "-7"),
        ("The answer is \\boxed{0.5}.", "1/2"),  # decimal against a fraction
        ("\\boxed{\\frac{1}{2}}", "0.5"),  # nested braces, LaTeX fraction
        ("\\boxed{\\dfrac{3}{4}}", "0.75"),
        ("\\boxed{-\\frac{1}{2}}", "-0.5"),
        ("\\boxed{3/4}", "\\frac{3}{4}"),
        ("\\boxed{1{,}234}", "1234"),  # LaTeX's thousands separator
        ("\\boxed{\\$18.00}", "18"),
        ("\\boxed{ 0.3333333 }", "1/3"),  # within the 1e-6 relative tolerance
        ("first \\boxed{3} then, on reflection, \\boxed{5}", "5"),  # the last box wins
        ("\\boxed{7}\nso #### 5", "5"),  # the later of #### and \boxed wins
        ("#### 7\nchecking: \\boxed{5}", "5"),
        ("\\boxed{\\sqrt{2}}", "\\sqrt{2}"),  # not a number: equal normalised text
    ],
)
def test_right_answers_score_one(response, truth):
    assert score(response, truth) == {"score": 1.0, "format": 1.0, "acc": 1.0}


@pytest.mark.parametrize(
    "response, truth",
    [
        ("#### 1,235", "1234"),
        ("\\boxed{0.33}", "1/3"),  # outside the tolerance
        ("\\boxed{5} then \\boxed{3}", "5"),  # an earlier box does not count
        ("\\boxed{\\sqrt{3}}", "\\sqrt{2}"),
        ("\\boxed{1/0}", "1"),  # division by zero is simply not a number
        ("#### 42 apples", "42"),  # the whole line must be the number
        ("\\boxed{0.000001}", "0"),  # a zero ground truth needs exactly zero
    ],
)
def test_wrong_answers_keep_format_but_score_zero(response, truth):
    assert score(response, truth) == {"score": 0.0, "format": 1.0, "acc": 0.0}


@pytest.mark.parametrize(
    "response",
    [
        "The answer is 42.",  # no marker
        "",
        "####   \n42",  # nothing after the marker on its line
        "\\boxed{4",  # truncated box
        "\\boxed{3} and finally \\boxed{\\frac{1}{2}",  # the last box is unclosed: no fallback to 3
        None,
    ],
)
def test_no_answer_scores_zero_format(response):
    assert score(response, "42") == {"score": 0.0, "format": 0.0, "acc": 0.0}


def test_parse_number_reads_exact_values():
    assert math_reward.parse_number("1,234.50") == Fraction(2469, 2)
    assert math_reward.parse_number("\\tfrac{-2}{4}") == Fraction(-1, 2)
    assert math_reward.parse_number("x + 1") is None
    assert math_reward.parse_number("1" * 100) is None  # over the length cap, not a huge Fraction


def test_missing_ground_truth_raises():
    with pytest.raises(ValueError, match="ground truth"):
        score("#### 1", None)


FRAGMENTS = st.sampled_from(
    ["####", "\\boxed{", "\\fbox{", "{", "}", "\\frac", "1", "2", "0", "/", ".", ",", "$", "-", " ", "\n", "x"]
)


@settings(max_examples=300)
@given(text=st.text() | st.lists(FRAGMENTS, max_size=40).map("".join), truth=st.sampled_from(["42", "1/2", "0", "x"]))
def test_arbitrary_text_returns_documented_values(text, truth):
    result = score(text, truth)
    assert set(result) == {"score", "format", "acc"}
    assert result["format"] in (0.0, 1.0) and result["acc"] in (0.0, 1.0)
    assert result["score"] == result["acc"]
    assert result["acc"] <= result["format"]  # no credit without an extracted answer
