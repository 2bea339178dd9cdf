"""Statement evaluation, rendering and the truth-table solver, against hand-worked cases and a brute force."""

import itertools

from hypothesis import given, settings
from hypothesis import strategies as st

from logicrl.data.kk.solver import solve, unique_solution
from logicrl.data.kk.statements import (
    AND,
    IFF,
    IMPLIES,
    KNAVE,
    KNIGHT,
    NOT,
    OR,
    depth,
    evaluate,
    from_json,
    max_width,
    render,
    to_json,
)  # fmt: skip

A, B, C = 0, 1, 2
NAMES = ["Zoey", "Oliver", "Emma"]


def knight(p):
    return (KNIGHT, p)


def knave(p):
    return (KNAVE, p)


# --- an independent reference: recursive evaluation, every assignment tried in turn ---

_REF_OPS = {
    NOT: lambda v: not v[0],
    AND: all,
    OR: any,
    IMPLIES: lambda v: (not v[0]) or v[1],
    IFF: lambda v: v[0] == v[1],
}


def ref_eval(statement, assignment):
    if statement[0] == KNIGHT:
        return assignment[statement[1]]
    if statement[0] == KNAVE:
        return not assignment[statement[1]]
    return _REF_OPS[statement[0]]([ref_eval(child, assignment) for child in statement[1:]])


def brute_force(statements):
    return {
        assignment
        for assignment in itertools.product([False, True], repeat=len(statements))
        if all(ref_eval(s, assignment) == assignment[p] for p, s in enumerate(statements))
    }


def statement_trees(n_people):
    leaves = st.tuples(st.sampled_from([KNIGHT, KNAVE]), st.integers(0, n_people - 1))
    return st.recursive(
        leaves,
        lambda kids: st.one_of(
            st.tuples(st.just(NOT), kids),
            st.lists(kids, min_size=2, max_size=4).map(lambda cs: (AND, *cs)),
            st.lists(kids, min_size=2, max_size=4).map(lambda cs: (OR, *cs)),
            st.tuples(st.just(IMPLIES), kids, kids),
            st.tuples(st.just(IFF), kids, kids),
        ),
        max_leaves=10,
    )


puzzles = st.integers(1, 8).flatmap(lambda n: st.tuples(*[statement_trees(n)] * n))


@settings(max_examples=300, deadline=None)
@given(puzzles)
def test_solver_agrees_with_brute_force(statements):
    solutions = solve(statements)
    assert set(solutions) == brute_force(statements)
    assert len(solutions) == len(set(solutions))
    expected_unique = solutions[0] if len(solutions) == 1 else None
    assert unique_solution(statements) == expected_unique


@settings(max_examples=200, deadline=None)
@given(st.integers(1, 8).flatmap(
    lambda n: st.tuples(statement_trees(n), st.lists(st.booleans(), min_size=n, max_size=n))))
def test_evaluate_agrees_with_reference(case):
    statement, assignment = case
    assert evaluate(statement, assignment) == ref_eval(statement, assignment)


@given(puzzles)
def test_json_round_trip(statements):
    assert from_json(to_json(statements)) == statements


# --- hand-worked puzzles ---


def test_self_accused_knave_has_no_solution():
    # A knight cannot truthfully call himself a knave, and a knave cannot say it (it would be true).
    assert solve([knave(A)]) == []
    assert unique_solution([knave(A)]) is None


def test_self_proclaimed_knight_alone_is_undetermined():
    # Both roles are consistent; assignments come in increasing number (knave first).
    assert solve([knight(A)]) == [(False,), (True,)]
    assert unique_solution([knight(A)]) is None


def test_b_calls_both_knaves():
    # B cannot be a knight (he would be calling himself a knave), so B lies: not both knaves,
    # so A is a knight, and A's "B is a knave" is true.
    statements = [knave(B), (AND, knave(A), knave(B))]
    assert solve(statements) == [(True, False)]


def test_paper_example():
    # mem-kk-logic's own unit test: A says B is a knave; B says A and B are knights.
    statements = [knave(B), (AND, knight(A), knight(B))]
    assert unique_solution(statements) == (True, False)


def test_three_people_with_iff():
    # C = not A, so A and C differ, so B ("A iff C") lies; then A's "B is a knave" is true.
    statements = [knave(B), (IFF, knight(A), knight(C)), knave(A)]
    assert solve(statements) == [(True, False, False)]


def test_knave_or_knight():
    # A knave could not say "I am a knave or ...", which would be true; so A is a knight,
    # the first disjunct is false, B must be a knight, and B's "A is a knight" holds.
    statements = [(OR, knave(A), knight(B)), knight(A)]
    assert solve(statements) == [(True, True)]


def test_mutual_accusation_has_two_solutions():
    statements = [knave(B), knave(A)]
    assert solve(statements) == [(True, False), (False, True)]


def test_evaluate_each_operator():
    zoey_knight_oliver_knave = [True, False]
    assert evaluate(knight(A), zoey_knight_oliver_knave) is True
    assert evaluate(knave(A), zoey_knight_oliver_knave) is False
    assert evaluate((NOT, knight(B)), zoey_knight_oliver_knave) is True
    assert evaluate((AND, knight(A), knave(B)), zoey_knight_oliver_knave) is True
    assert evaluate((AND, knight(A), knight(B)), zoey_knight_oliver_knave) is False
    assert evaluate((OR, knave(A), knight(B)), zoey_knight_oliver_knave) is False
    assert evaluate((IMPLIES, knight(B), knave(A)), zoey_knight_oliver_knave) is True  # false premise
    assert evaluate((IMPLIES, knight(A), knight(B)), zoey_knight_oliver_knave) is False
    assert evaluate((IFF, knave(A), knight(B)), zoey_knight_oliver_knave) is True  # both false


def test_depth_and_width():
    assert depth(knight(A)) == 1 and max_width(knight(A)) == 0
    tree = (AND, knight(A), (OR, knave(B), knight(C), knave(A)))
    assert depth(tree) == 3 and max_width(tree) == 3


# --- rendering ---


def test_render_depth_two_matches_paper_wording():
    assert render(knight(A), NAMES) == "Zoey is a knight"
    assert render((NOT, knave(B)), NAMES) == "Oliver is not a knave"
    assert render((AND, knight(A), knave(C)), NAMES) == "Zoey is a knight and Emma is a knave"
    assert render((OR, knave(A), knave(B), knight(C)), NAMES) == \
        "Zoey is a knave or Oliver is a knave or Emma is a knight"
    assert render((IMPLIES, knight(B), knave(C)), NAMES) == "if Oliver is a knight then Emma is a knave"
    assert render((IFF, knave(A), knight(B)), NAMES) == "Zoey is a knave if and only if Oliver is a knight"


def test_render_deeper_trees_brackets_inner_compounds():
    tree = (OR, (AND, knight(A), knave(B)), (NOT, knight(C)))
    assert render(tree, NAMES) == "(Zoey is a knight and Oliver is a knave) or Emma is not a knight"
    assert render((NOT, (IFF, knight(A), knight(B))), NAMES) == (
        "it is not the case that (Zoey is a knight if and only if Oliver is a knight)"
    )
    assert render((AND, (NOT, (OR, knight(A), knight(B))), knight(C)), NAMES) == (
        "(it is not the case that (Zoey is a knight or Oliver is a knight)) and Emma is a knight"
    )
