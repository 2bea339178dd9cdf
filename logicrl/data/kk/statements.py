"""Statement trees of Knights-and-Knaves puzzles: evaluation, rendering, serialisation.

A statement is a nested tuple, in the form of Xie et al. 2024, "On Memorization of Large
Language Models in Logical Reasoning" (the mem-kk-logic generator), so the trees stored in
a dataset read the same as theirs:

    ("telling-truth", i)        person i is a knight
    ("lying", i)                person i is a knave
    ("not", s)
    ("and", s1, s2, ...)        two or more children
    ("or", s1, s2, ...)
    ("->", s1, s2)              if s1 then s2
    ("<=>", s1, s2)             s1 if and only if s2

Tuples rather than classes: they hash (the generator dedupes puzzles by them) and map
one-to-one onto JSON lists, which is how a dataset stores them.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Union

KNIGHT = "telling-truth"
KNAVE = "lying"
NOT = "not"
AND = "and"
OR = "or"
IMPLIES = "->"
IFF = "<=>"

LEAVES = (KNIGHT, KNAVE)
OPERATORS = (NOT, AND, OR, IMPLIES, IFF)

Statement = tuple  # recursive: (op, *children) or (KNIGHT | KNAVE, person)
Assignment = Sequence[bool]  # True: that person is a knight


def evaluate(statement: Statement, assignment: Assignment) -> bool:
    """Truth of `statement` when person i is a knight exactly where assignment[i] is True."""
    op = statement[0]
    if op == KNIGHT:
        return bool(assignment[statement[1]])
    if op == KNAVE:
        return not assignment[statement[1]]
    if op == NOT:
        return not evaluate(statement[1], assignment)
    if op == AND:
        return all(evaluate(child, assignment) for child in statement[1:])
    if op == OR:
        return any(evaluate(child, assignment) for child in statement[1:])
    if op == IMPLIES:
        return (not evaluate(statement[1], assignment)) or evaluate(statement[2], assignment)
    if op == IFF:
        return evaluate(statement[1], assignment) == evaluate(statement[2], assignment)
    raise ValueError(f"unknown statement node {op!r} in {statement!r}")


def is_consistent(statements: Sequence[Statement], assignment: Assignment) -> bool:
    """A knight's statement is true and a knave's is false, for every person."""
    return all(evaluate(s, assignment) == bool(k) for s, k in zip(statements, assignment, strict=True))


def depth(statement: Statement) -> int:
    """Levels in the tree; a leaf has depth 1 (the generator's `depth_constraint` counts the same way)."""
    if statement[0] in LEAVES:
        return 1
    return 1 + max(depth(child) for child in statement[1:])


def max_width(statement: Statement) -> int:
    """Most children under one node; 0 for a leaf."""
    if statement[0] in LEAVES:
        return 0
    return max(len(statement) - 1, *(max_width(child) for child in statement[1:]))


def mentioned(statement: Statement) -> set[int]:
    """Every person a statement talks about."""
    if statement[0] in LEAVES:
        return {statement[1]}
    return set().union(*(mentioned(child) for child in statement[1:]))


# --- natural language --------------------------------------------------------------------


def render(statement: Statement, names: Sequence[str]) -> str:
    """English for one statement, e.g. "Zoey is a knight and Oliver is not a knave".

    Up to depth 2 this matches the paper's wording ("If A is a knight then B is a knave",
    "A is a knave if and only if B is a knight"); the paper cannot render deeper trees, so
    here a compound inside a compound is put in parentheses to keep it unambiguous.
    """
    return _render(statement, names, nested=False)


def _render(statement: Statement, names: Sequence[str], nested: bool) -> str:
    op = statement[0]
    if op in LEAVES:
        return _leaf(statement, names, negated=False)
    if op == NOT and statement[1][0] in LEAVES:
        return _leaf(statement[1], names, negated=True)
    children = [_render(child, names, nested=True) for child in statement[1:]]
    if op == NOT:
        text = f"it is not the case that {children[0]}"
    elif op in (AND, OR):
        text = f" {op} ".join(children)
    elif op == IMPLIES:
        text = f"if {children[0]} then {children[1]}"
    elif op == IFF:
        text = f"{children[0]} if and only if {children[1]}"
    else:
        raise ValueError(f"unknown statement node {op!r} in {statement!r}")
    return f"({text})" if nested else text


def _leaf(statement: Statement, names: Sequence[str], negated: bool) -> str:
    role = "a knight" if statement[0] == KNIGHT else "a knave"
    return f"{names[statement[1]]} is {'not ' if negated else ''}{role}"


# --- storage -----------------------------------------------------------------------------


def to_json(statements: Sequence[Statement]) -> str:
    """The trees as a JSON list of lists: what `reward_model.ground_truth.statements` holds."""
    return json.dumps(statements, separators=(",", ":"))


def from_json(text: str) -> tuple[Statement, ...]:
    """Inverse of `to_json`."""
    return tuple(_as_tuple(s) for s in json.loads(text))


def _as_tuple(node: Union[list, str, int]):
    if isinstance(node, list):
        return tuple(_as_tuple(child) for child in node)
    return node
