"""Exhaustive K&K solver: every statement is evaluated over all 2^N assignments at once.

A truth table over the 2^N assignments is one Python int of 2^N bits: bit `a` is the value
under assignment `a`, where person i is a knight iff bit i of `a` is set. `and`/`or`/`not`
on tables are then `&`/`|`/`^full`, and a whole tree costs one big-int op per node rather
than 2^N recursive evaluations. With N <= 8 a table is at most 256 bits, small enough that
this beats numpy boolean arrays (whose per-call overhead dominates at that size).
"""

from __future__ import annotations

from collections.abc import Sequence
from functools import cache

from logicrl.data.kk.statements import AND, IFF, IMPLIES, KNAVE, KNIGHT, NOT, OR, Statement

MAX_PEOPLE = 8  # 2^8-bit tables; far past this, exhaustive search stops being cheap


@cache
def _knight_tables(n_people: int) -> tuple[tuple[int, ...], int]:
    """(table of "person i is a knight" for each i, table with every bit set)."""
    n_assignments = 1 << n_people
    tables = tuple(
        sum(1 << a for a in range(n_assignments) if (a >> i) & 1) for i in range(n_people)
    )
    return tables, (1 << n_assignments) - 1


def truth_table(statement: Statement, knights: Sequence[int], full: int) -> int:
    """The statement's value under every assignment, as a 2^N-bit int."""
    op = statement[0]
    if op == KNIGHT:
        return knights[statement[1]]
    if op == KNAVE:
        return knights[statement[1]] ^ full
    if op == NOT:
        return truth_table(statement[1], knights, full) ^ full
    if op == AND:
        table = full
        for child in statement[1:]:
            table &= truth_table(child, knights, full)
        return table
    if op == OR:
        table = 0
        for child in statement[1:]:
            table |= truth_table(child, knights, full)
        return table
    if op == IMPLIES:
        return (truth_table(statement[1], knights, full) ^ full) | truth_table(statement[2], knights, full)
    if op == IFF:
        return truth_table(statement[1], knights, full) ^ truth_table(statement[2], knights, full) ^ full
    raise ValueError(f"unknown statement node {op!r} in {statement!r}")


def consistent_assignments(statements: Sequence[Statement]) -> int:
    """Bit `a` set iff assignment `a` makes every knight's statement true and every knave's false."""
    n_people = len(statements)
    if not 1 <= n_people <= MAX_PEOPLE:
        raise ValueError(f"the solver takes 1 to {MAX_PEOPLE} people, got {n_people}")
    knights, full = _knight_tables(n_people)
    consistent = full
    for person, statement in enumerate(statements):
        # person's role must equal their statement's truth: XNOR of the two tables
        consistent &= knights[person] ^ truth_table(statement, knights, full) ^ full
        if not consistent:
            break
    return consistent


def decode(assignment_index: int, n_people: int) -> tuple[bool, ...]:
    """Assignment number -> (is_knight for person 0, 1, ...)."""
    return tuple(bool((assignment_index >> i) & 1) for i in range(n_people))


def solve(statements: Sequence[Statement]) -> list[tuple[bool, ...]]:
    """Every consistent assignment, in increasing assignment number."""
    mask = consistent_assignments(statements)
    return [decode(a, len(statements)) for a in range(mask.bit_length()) if (mask >> a) & 1]


def unique_solution(statements: Sequence[Statement]) -> tuple[bool, ...] | None:
    """The one consistent assignment, or None when there are zero or several."""
    mask = consistent_assignments(statements)
    if mask.bit_count() != 1:
        return None
    return decode(mask.bit_length() - 1, len(statements))
