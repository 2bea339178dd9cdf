"""The evaluation's statistics against hand-computed values (logicrl/eval/estimators.py)."""

import math

import pytest

from logicrl.eval.estimators import bootstrap, maj_at_k, majority, pass_at_k, wilson


@pytest.mark.parametrize(("k", "expected"), [
    (1, 1 - 3 / 5),    # 1 - C(3,1)/C(5,1)
    (2, 1 - 3 / 10),   # 1 - C(3,2)/C(5,2)
    (3, 1 - 1 / 10),   # 1 - C(3,3)/C(5,3)
    (4, 1.0),          # C(3,4) = 0: every 4 of the 5 hold a right one
    (5, 1.0),
])
def test_pass_at_k_n5_c2(k, expected):
    assert pass_at_k(5, 2, k) == pytest.approx(expected, abs=1e-12)


def test_pass_at_k_edges_and_large_n():
    assert pass_at_k(4, 0, 2) == 0.0 and pass_at_k(4, 4, 1) == 1.0
    # n=200, c=1, k=100: exactly 1/2 (half the 100-subsets hold the one right sample); binomials of this
    # size are not exact in floats, the product is.
    assert pass_at_k(200, 1, 100) == pytest.approx(0.5, abs=1e-12)
    assert pass_at_k(64, 10, 32) == pytest.approx(1 - math.comb(54, 32) / math.comb(64, 32), rel=1e-12)
    with pytest.raises(ValueError, match="k <= n"):
        pass_at_k(3, 1, 4)


def test_majority_breaks_ties_by_first_given():
    assert majority(["b", "a", "a", "b"]) == 0  # 2-2: "b" came first
    assert majority(["a", "b", "b"]) == 1
    assert majority([None, "c", None]) == 1  # nothing extracted does not vote
    assert majority([None, None]) is None


def test_maj_at_k_expectation_over_subsets():
    answers, right = ["72", "71", "72"], [True, False, True]
    assert maj_at_k(answers, right, 1) == pytest.approx(2 / 3)
    # {0,1}: 72-71 tie, 72 first: right; {0,2}: right; {1,2}: 71-72 tie, 71 first: wrong
    assert maj_at_k(answers, right, 2) == pytest.approx(2 / 3)
    assert maj_at_k(answers, right, 3) == 1.0
    # a 5-6 tie with the first answer wrong, and a response with no answer
    assert maj_at_k(["5", "6", None], [False, False, False], 3) == 0.0
    assert maj_at_k([None, None], [False, False], 2) == 0.0


@pytest.mark.parametrize(("right", "total", "low", "high"), [
    # Newcombe (1998), "Two-sided confidence intervals for the single proportion", Table I, method 3 (Wilson)
    (81, 263, 0.2553, 0.3662),
    (15, 148, 0.0624, 0.1605),
    (0, 20, 0.0, 0.1611),
    (1, 29, 0.0061, 0.1718),
])
def test_wilson_matches_newcombe(right, total, low, high):
    lo, hi = wilson(right / total, total)
    assert lo == pytest.approx(low, abs=1e-4) and hi == pytest.approx(high, abs=1e-4)


def test_bootstrap_is_seeded_and_covers_the_resamples():
    # Two problems, values 0 and 1: resampled means are 0, 1/2 or 1 with chances 1/4, 1/2, 1/4, so the
    # 2.5% and 97.5% percentiles of 1000 draws are 0 and 1.
    assert bootstrap([0.0, 1.0]) == (0.0, 1.0)
    assert bootstrap([0.3]) == (0.3, 0.3)
    assert bootstrap([0.1, 0.4, 0.9, 0.5]) == bootstrap([0.1, 0.4, 0.9, 0.5])
