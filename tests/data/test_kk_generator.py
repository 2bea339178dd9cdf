"""The paper's sampler: only uniquely-solvable, distinct puzzles, within the asked shape, fixed by the seed."""

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logicrl.data.kk.generator import PuzzleSpaceExhausted, check_shape, generate_puzzles
from logicrl.data.kk.render import NAMES, render_puzzle, render_solution, sample_names
from logicrl.data.kk.statements import KNAVE, LEAVES, depth, is_consistent, max_width, render


def all_solutions(statements):
    return [a for a in itertools.product([False, True], repeat=len(statements)) if is_consistent(statements, a)]


def leaves(statement):
    if statement[0] in LEAVES:
        return [statement]
    return [leaf for child in statement[1:] for leaf in leaves(child)]


@settings(max_examples=100, deadline=None)
@given(
    seed=st.integers(0, 2**32 - 1),
    n_people=st.integers(2, 8),
    max_depth=st.integers(2, 4),
    max_children=st.integers(2, 4),
)
def test_every_puzzle_has_exactly_its_stored_solution(seed, n_people, max_depth, max_children):
    puzzles = generate_puzzles(5, n_people, np.random.default_rng(seed), depth=max_depth, width=max_children)
    assert len(puzzles) == 5
    assert len({p.statements for p in puzzles}) == 5
    for puzzle in puzzles:
        assert puzzle.n_people == n_people
        assert all_solutions(puzzle.statements) == [puzzle.solution]
        for speaker, statement in enumerate(puzzle.statements):
            assert depth(statement) <= max_depth
            assert max_width(statement) <= max_children
            assert (KNAVE, speaker) not in leaves(statement)


def test_same_seed_same_puzzles_and_different_seed_different():
    first = generate_puzzles(50, 5, np.random.default_rng(7))
    again = generate_puzzles(50, 5, np.random.default_rng(7))
    other = generate_puzzles(50, 5, np.random.default_rng(8))
    assert first == again
    assert first != other


def test_seen_set_keeps_two_calls_disjoint():
    rng, seen = np.random.default_rng(0), set()
    test = generate_puzzles(30, 3, rng, seen=seen)
    train = generate_puzzles(300, 3, rng, seen=seen)
    assert not {p.statements for p in test} & {p.statements for p in train}
    assert len(seen) == 330


def test_two_people_run_out_of_puzzles_with_a_clear_error():
    # Depth 2, width 2 allows only a few hundred distinct 2-person puzzles with one solution.
    with pytest.raises(PuzzleSpaceExhausted, match="ask for fewer puzzles or raise depth/width"):
        generate_puzzles(1000, 2, np.random.default_rng(0))


@pytest.mark.parametrize(
    "n_people, depth_, width, key",
    [(1, 2, 2, "people=1"), (9, 2, 2, "people=9"), (3, 1, 2, "depth=1"), (3, 2, 1, "width=1")],
)
def test_bad_shape_names_the_argument(n_people, depth_, width, key):
    with pytest.raises(ValueError, match=key):
        check_shape(n_people, depth_, width)


def test_names_are_distinct_and_none_contains_another():
    lowered = [n.lower() for n in NAMES]
    assert len(set(lowered)) == len(lowered) >= 8
    for a, b in itertools.permutations(lowered, 2):
        assert a not in b, f"{a!r} is inside {b!r}"
    assert not {"knight", "knave"} & set(lowered)


def test_sampled_names_are_distinct_within_a_puzzle():
    rng = np.random.default_rng(0)
    for _ in range(200):
        names = sample_names(rng, 8)
        assert len(set(names)) == 8


def test_rendered_puzzle_and_solution():
    puzzle = generate_puzzles(1, 3, np.random.default_rng(0))[0]
    names = ["Zoey", "Oliver", "Emma"]
    text = render_puzzle(puzzle, names, np.random.default_rng(0))
    assert text.startswith(
        "A very special island is inhabited only by knights and knaves. Knights always tell the truth, "
        "and knaves always lie. You meet 3 inhabitants: Zoey, Oliver, and Emma. "
    )
    assert text.endswith(" So who is a knight and who is a knave?")
    for speaker, statement in enumerate(puzzle.statements):
        clause = render(statement, names)
        # quoted speech capitalises the clause's first letter, reported speech does not
        assert clause[1:] in text and names[speaker] in text
    roles = ["a knight" if k else "a knave" for k in puzzle.solution]
    assert render_solution(names, puzzle.solution) == (
        f"(1) Zoey is {roles[0]}\n(2) Oliver is {roles[1]}\n(3) Emma is {roles[2]}"
    )


def test_two_inhabitants_are_joined_without_a_comma():
    puzzle = generate_puzzles(1, 2, np.random.default_rng(0))[0]
    text = render_puzzle(puzzle, ["Zoey", "Oliver"], np.random.default_rng(0))
    assert "You meet 2 inhabitants: Zoey and Oliver." in text
