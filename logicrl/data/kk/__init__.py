"""Knights-and-Knaves puzzles (Xie et al. 2024): generator, solver, rendering, dataset builder.

    statements.py  statement trees: evaluate, render, JSON
    solver.py      all 2^N assignments at once, as big-int truth tables
    generator.py   the paper's sampler, keeping puzzles with exactly one solution
    render.py      puzzle and solution in English
    templates.py   prompt templates by name
    build.py       verl/Logic-RL rows and parquet files
    __main__.py    the CLI (`python -m logicrl.data.kk --help`)
"""

from logicrl.data.kk.build import build_dataset, build_splits
from logicrl.data.kk.generator import Puzzle, PuzzleSpaceExhausted, generate_puzzles
from logicrl.data.kk.render import render_puzzle, render_solution
from logicrl.data.kk.solver import solve, unique_solution

__all__ = [
    "Puzzle",
    "PuzzleSpaceExhausted",
    "build_dataset",
    "build_splits",
    "generate_puzzles",
    "render_puzzle",
    "render_solution",
    "solve",
    "unique_solution",
]
