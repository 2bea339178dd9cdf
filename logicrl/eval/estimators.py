"""The statistics of an evaluation: per-problem estimators and their 95% intervals over problems.

pass@k is Chen et al. 2021's unbiased estimator (arXiv:2107.03374, eq. 1), 1 - C(n-c, k) / C(n, k),
computed as a running product, never as binomials (C(64, 32) overflows a float's exactness). maj@k for
k < n is the expectation over the C(n, k) k-subsets of the n samples of "the subset's majority answer is
right", enumerated exactly up to MAJ_EXACT_SUBSETS subsets and estimated from that many subsets drawn with
a fixed seed beyond. Intervals treat problems as the independent units (n samples of one problem are not
n independent draws): Wilson's score interval for a share over problems, a percentile bootstrap over
problems (BOOTSTRAP_DRAWS resamples, fixed seed) for pass@k and maj@k.
"""

from __future__ import annotations

import itertools
import math
import random
from collections.abc import Hashable, Sequence

import numpy as np

Z95 = 1.959963984540054  # the standard normal's 97.5% quantile
BOOTSTRAP_DRAWS = 1000
BOOTSTRAP_SEED = 0  # intervals are reproducible: the same samples give the same eval.json
MAJ_EXACT_SUBSETS = 5000


def pass_at_k(n: int, c: int, k: int) -> float:
    """Chance that at least one of k samples drawn without replacement from n (c of them right) is right."""
    if not 0 <= c <= n or not 1 <= k <= n:
        raise ValueError(f"pass@k needs 0 <= c <= n and 1 <= k <= n, got n={n}, c={c}, k={k}")
    if n - c < k:  # every k-subset holds a right sample
        return 1.0
    # C(n-c, k) / C(n, k) = prod_{i=n-c+1}^{n} (1 - k / i): a product of numbers in [0, 1].
    miss = 1.0
    for i in range(n - c + 1, n + 1):
        miss *= 1.0 - k / i
    return 1.0 - miss


def majority(answers: Sequence[Hashable | None]) -> int | None:
    """Index (into `answers`) of the vote's winner: the most frequent answer, ties broken by which was given
    first; None answers (nothing extracted) do not vote. None when nobody voted."""
    counts: dict = {}
    first: dict = {}
    for i, a in enumerate(answers):
        if a is None:
            continue
        counts[a] = counts.get(a, 0) + 1
        first.setdefault(a, i)
    if not counts:
        return None
    best = max(counts, key=lambda a: (counts[a], -first[a]))
    return first[best]


def maj_at_k(answers: Sequence[Hashable | None], correct: Sequence[bool], k: int) -> float:
    """Expected correctness of the majority vote over k of the n samples (module docstring): each k-subset
    keeps the samples' order, so a tie goes to the answer sampled first. A subset where nobody answered
    counts as wrong; the winner's correctness is that of its first sample."""
    n = len(answers)
    if len(correct) != n or not 1 <= k <= n:
        raise ValueError(f"maj@k needs 1 <= k <= n = {n} answers and as many correctness flags, got k={k}, "
                         f"{len(correct)} flags")

    def vote(subset: Sequence[int]) -> float:
        winner = majority([answers[i] for i in subset])
        return 0.0 if winner is None else float(correct[subset[winner]])

    if math.comb(n, k) <= MAJ_EXACT_SUBSETS:
        subsets = list(itertools.combinations(range(n), k))
    else:
        rng = random.Random(BOOTSTRAP_SEED)
        subsets = [sorted(rng.sample(range(n), k)) for _ in range(MAJ_EXACT_SUBSETS)]
    return sum(vote(s) for s in subsets) / len(subsets)


def wilson(share: float, total: int, z: float = Z95) -> tuple[float, float]:
    """Wilson's score interval for a share `share` observed over `total` units (Wilson 1927; Newcombe 1998,
    method 3). `share` may be a mean of per-unit means: the interval then treats each unit as one draw."""
    if total <= 0:
        return 0.0, 1.0
    z2 = z * z
    centre = (share + z2 / (2 * total)) / (1 + z2 / total)
    half = z / (1 + z2 / total) * math.sqrt(share * (1 - share) / total + z2 / (4 * total * total))
    return max(0.0, centre - half), min(1.0, centre + half)


def bootstrap(values: Sequence[float], draws: int = BOOTSTRAP_DRAWS, seed: int = BOOTSTRAP_SEED,
              level: float = 0.95) -> tuple[float, float]:
    """Percentile bootstrap interval of the mean of `values` (one per problem), resampling problems."""
    if not values:
        return 0.0, 0.0
    rows = np.asarray(values, dtype=np.float64)
    picks = np.random.default_rng(seed).integers(0, len(rows), size=(draws, len(rows)))  # [draws, problems]
    means = np.sort(rows[picks].mean(axis=1))
    tail = (1 - level) / 2
    return float(means[math.floor(tail * (draws - 1))]), float(means[math.ceil((1 - tail) * (draws - 1))])
