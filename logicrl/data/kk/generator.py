"""Random K&K puzzles with exactly one solution.

Sampling follows Xie et al. 2024 ("On Memorization of Large Language Models in Logical
Reasoning", the mem-kk-logic `KKProblemSampler`): each person makes one statement; at every
node a six-sided die picks a leaf (1/6), `not` (1/6), `and`/`or` (1/6 each, with 2 to
`width` children) or `->`/`<=>` (1/6 each); at depth 1 the node is always a leaf. Siblings
are distinct, and no one says "I am a knave" (a leaf-level contradiction that would make
most puzzles unsolvable). Draws whose puzzle has zero or several solutions, or repeats an
earlier puzzle, are thrown away and redrawn.

All randomness comes from the `numpy.random.Generator` passed in, so a seed fixes the output.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from logicrl.data.kk.solver import MAX_PEOPLE, unique_solution
from logicrl.data.kk.statements import AND, IFF, IMPLIES, KNAVE, KNIGHT, NOT, OR, Statement

MIN_PEOPLE = 2
# Depth 1 (leaves only) never has a unique solution: every leaf constraint survives flipping
# everyone's role, so a solution always comes with its mirror image.
MIN_DEPTH = 2
MIN_WIDTH = 2
# Consecutive rejected draws before giving up; at depth 2 about 1 draw in 3 is kept,
# so hitting this means the puzzle space is (nearly) used up, as with 2 people.
MAX_CONSECUTIVE_REJECTS = 20_000
# Redraws allowed when looking for a sibling that differs from the ones drawn so far.
_MAX_SIBLING_REDRAWS = 100


@dataclass(frozen=True)
class Puzzle:
    """Statements (statements[i] is what person i says) and the unique solution (True: knight)."""

    statements: tuple[Statement, ...]
    solution: tuple[bool, ...]

    @property
    def n_people(self) -> int:
        return len(self.statements)


class PuzzleSpaceExhausted(RuntimeError):
    """Too many rejected draws in a row: fewer unique puzzles exist than were asked for."""


def check_shape(n_people: int, depth: int, width: int) -> None:
    """Raise ValueError naming the bad argument and its allowed range."""
    if not MIN_PEOPLE <= n_people <= MAX_PEOPLE:
        raise ValueError(f"people={n_people} must be between {MIN_PEOPLE} and {MAX_PEOPLE}")
    if depth < MIN_DEPTH:
        raise ValueError(f"depth={depth} must be at least {MIN_DEPTH} (leaf-only puzzles never have one solution)")
    if width < MIN_WIDTH:
        raise ValueError(f"width={width} must be at least {MIN_WIDTH} (and/or need two operands)")


def sample_statement(rng: np.random.Generator, speaker: int, n_people: int, depth: int, width: int) -> Statement:
    """One statement tree of at most `depth` levels and at most `width` children per and/or."""
    dice = int(rng.integers(0, 6))
    if depth <= 1 or dice == 0:
        while True:
            role = KNIGHT if rng.integers(0, 2) == 0 else KNAVE
            person = int(rng.integers(0, n_people))
            if not (role == KNAVE and person == speaker):
                return (role, person)
    if dice == 1:
        return (NOT, sample_statement(rng, speaker, n_people, depth - 1, width))
    if dice in (2, 3):
        n_children = int(rng.integers(2, width + 1))
        op = AND if dice == 2 else OR
    else:
        n_children = 2
        op = IMPLIES if dice == 4 else IFF
    return (op, *_distinct_children(rng, speaker, n_people, depth - 1, width, n_children))


def _distinct_children(rng, speaker, n_people, depth, width, count) -> list[Statement]:
    children: list[Statement] = []
    redraws = 0
    while len(children) < count:
        child = sample_statement(rng, speaker, n_people, depth, width)
        if child not in children:
            children.append(child)
            redraws = 0
            continue
        redraws += 1
        # With 2 people and leaf children only 3 distinct leaves exist, so a wide `and`
        # could loop forever (the paper's sampler does); settle for fewer children instead.
        if redraws >= _MAX_SIBLING_REDRAWS and len(children) >= 2:
            break
    return children


def sample_statements(rng: np.random.Generator, n_people: int, depth: int, width: int) -> tuple[Statement, ...]:
    """One candidate puzzle: a statement for each person, not yet checked for uniqueness."""
    return tuple(sample_statement(rng, p, n_people, depth, width) for p in range(n_people))


def generate_puzzles(
    count: int,
    n_people: int,
    rng: np.random.Generator,
    *,
    depth: int = 2,
    width: int = 2,
    seen: set[tuple[Statement, ...]] | None = None,
) -> list[Puzzle]:
    """`count` distinct puzzles with exactly one solution each.

    `seen` holds statement tuples that must not be produced (and receives the new ones), so
    calling this twice with one set yields two disjoint lists, e.g. a test and a train split.
    """
    check_shape(n_people, depth, width)
    seen = set() if seen is None else seen
    puzzles: list[Puzzle] = []
    rejects = 0
    while len(puzzles) < count:
        statements = sample_statements(rng, n_people, depth, width)
        solution = None if statements in seen else unique_solution(statements)
        if solution is None:
            rejects += 1
            if rejects >= MAX_CONSECUTIVE_REJECTS:
                raise PuzzleSpaceExhausted(
                    f"found only {len(puzzles)} of {count} new puzzles of {n_people} people "
                    f"(depth={depth}, width={width}) before {rejects} draws in a row were repeats or "
                    f"lacked a unique solution; ask for fewer puzzles or raise depth/width"
                )
            continue
        rejects = 0
        seen.add(statements)
        puzzles.append(Puzzle(statements, solution))
    return puzzles
