"""A puzzle and its solution in English.

The wording follows the paper's formatter (Xie et al. 2024): a fixed island preamble, the
inhabitants in order, one statement each with a randomly chosen way of saying it, and the
question. The solution is the numbered form Logic-RL's reward parses:
"(1) Zoey is a knight\n(2) Oliver is a knave", in the order people were introduced.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from logicrl.data.kk.generator import Puzzle
from logicrl.data.kk.statements import render

# No name contains another (e.g. no "Liam" beside "William"), so a reward that looks for
# "<Name> is a knight" can never match one person's name inside another's.
NAMES = (
    "Zoey", "Oliver", "Emma", "Liam", "Olivia", "Noah", "Ava", "Ethan", "Sophia", "Mason",
    "Mia", "James", "Charlotte", "Benjamin", "Amelia", "Lucas", "Harper", "Henry", "Evelyn",
    "Alexander", "Abigail", "Michael", "Emily", "Daniel", "Elizabeth", "Jacob", "Logan",
    "Avery", "Jackson", "Scarlett", "Grace", "Aiden", "Chloe", "Owen", "Victoria", "Samuel",
    "Riley", "Matthew", "Aria", "Joseph", "Lily", "Luke", "Aurora", "David", "Penelope",
    "Isabella", "Sebastian",
)  # fmt: skip

PREAMBLE = (
    "A very special island is inhabited only by knights and knaves. "
    "Knights always tell the truth, and knaves always lie."
)
QUESTION = "So who is a knight and who is a knave?"

# `{clause}` continues a sentence ("... says that if Zoey is a knight then ..."); `{quote}`
# is direct speech and starts with a capital.
SAYINGS = (
    "{name} says that {clause}.",
    "{name} tells you that {clause}.",
    "{name} claims that {clause}.",
    '{name} says, "{quote}."',
    '{name} states, "{quote}."',
    "In {name}'s words: \"{quote}.\"",
    '"{quote}," {name} declares.',
    'According to {name}, "{quote}."',
)


def sample_names(rng: np.random.Generator, n_people: int) -> list[str]:
    """Distinct names for the people of one puzzle."""
    return [NAMES[i] for i in rng.choice(len(NAMES), size=n_people, replace=False)]


def render_puzzle(puzzle: Puzzle, names: Sequence[str], rng: np.random.Generator) -> str:
    """The whole puzzle as one paragraph; `rng` picks how each person's statement is phrased."""
    lines = [PREAMBLE, f"You meet {puzzle.n_people} inhabitants: {_enumerate(names)}."]
    for speaker, statement in enumerate(puzzle.statements):
        clause = render(statement, names)
        saying = SAYINGS[int(rng.integers(0, len(SAYINGS)))]
        lines.append(saying.format(name=names[speaker], clause=clause, quote=clause[0].upper() + clause[1:]))
    lines.append(QUESTION)
    return " ".join(lines)


def render_solution(names: Sequence[str], solution: Sequence[bool]) -> str:
    """'(1) Zoey is a knight\\n(2) Oliver is a knave' in introduction order."""
    return "\n".join(
        f"({i}) {name} is {'a knight' if knight else 'a knave'}"
        for i, (name, knight) in enumerate(zip(names, solution, strict=True), start=1)
    )


def _enumerate(names: Sequence[str]) -> str:
    if len(names) == 2:
        return f"{names[0]} and {names[1]}"
    return ", ".join(names[:-1]) + ", and " + names[-1]
