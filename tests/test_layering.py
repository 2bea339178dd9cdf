"""DESIGN.md's layering, checked on the source: no package imports one above it, and neither packages nor
files import in a cycle.

    algos, data, tools <- models, reward <- config <- memory <- preflight <- workers, controller <- trainer, launch
    <- main_ppo

Every module under logicrl/ is parsed with `ast` (not imported, so this runs in a fraction of a
second and sees every import: module level, inside functions, under `if TYPE_CHECKING`). A module
belongs to the package directly under logicrl/ that holds it; modules directly in logicrl/
(logicrl/rng.py, logicrl/__init__.py) form the bottom layer, below algos and data, so every layer
may use them, and they may use nothing else of logicrl.

The rule: a module may import its own package, or a package on a lower layer; packages on the same
layer do not import each other either (separate rooms, wired together by the layer above). A new
package under logicrl/ must be given its layer in LAYERS below.

Inside a package no two files import each other, directly or round a longer cycle, lazily or not: a
cycle means a name lives in the wrong file. Importing a name from a package's __init__ is an import of
the file that defines it, so __init__ files take no edges in.
"""

from __future__ import annotations

import ast
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "logicrl"
TOP_LEVEL = "logicrl"  # the bottom layer: modules directly in logicrl/

# Lowest first; one tuple per layer.
LAYERS = [
    (TOP_LEVEL,),
    ("algos", "data", "tools"),  # tools: the tool protocol, runner and sandbox; config validates tool files
    ("models", "reward"),
    ("config",),
    ("memory",),
    ("preflight",),  # may import memory: it runs the planner
    ("workers", "controller"),
    ("trainer", "launch"),
    ("main_ppo",),  # main_ppo.py at the repository root: nothing in logicrl/ imports it
]
LEVEL = {name: i for i, layer in enumerate(LAYERS) for name in layer}


@dataclass(frozen=True)
class Import:
    file: Path
    line: int
    source: str  # the import statement as written
    importer: str  # package of the importing module (for file_imports: the module itself)
    imported: str  # package of the imported module (for file_imports: the module itself)

    def __str__(self) -> str:
        return f"{self.file.relative_to(ROOT)}:{self.line}: {self.source}  ({self.importer} -> {self.imported})"


def _module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _package_of(module: str) -> str | None:
    """'logicrl.workers.fsdp' -> 'workers'; 'logicrl.rng' and 'logicrl' -> the top level; None: not ours."""
    parts = module.split(".")
    if parts[0] == "main_ppo":
        return "main_ppo"
    if parts[0] != "logicrl":
        return None
    if len(parts) == 1 or (PACKAGE / f"{parts[1]}.py").is_file():
        return TOP_LEVEL  # logicrl itself or a top-level module (logicrl.rng)
    if len(parts) == 2 and not (PACKAGE / parts[1]).is_dir():
        return TOP_LEVEL  # a name defined in logicrl/__init__.py (`from logicrl import __version__`)
    return parts[1]


def _from_base(node: ast.ImportFrom, module: str, is_package: bool) -> str:
    """The module a `from X import ...` names, a relative X resolved against `module`."""
    base = node.module or ""
    if node.level:
        here = module.split(".") if is_package else module.split(".")[:-1]
        anchor = here[: len(here) - (node.level - 1)]
        base = ".".join(anchor + ([base] if base else []))
    return base


def _targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool) -> list[str]:
    """The modules an import statement names, relative imports resolved against `module`."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = _from_base(node, module, is_package)
    # `from logicrl import rng`: the name may be a module; deeper, the package is already known.
    return [f"{base}.{alias.name}" for alias in node.names] if base == "logicrl" else [base]


def _file_targets(node: ast.Import | ast.ImportFrom, module: str, is_package: bool, modules: set[str]) -> list[str]:
    """The modules (files) an import statement reaches: `from a import b` reaches a.b where b is a
    module, else the file of a (a.py, or a/__init__.py); `import a.b.c` reaches a.b.c."""
    if isinstance(node, ast.Import):
        return [alias.name for alias in node.names]
    base = _from_base(node, module, is_package)
    return [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]


def file_imports() -> list[Import]:
    """Every import of one logicrl module by another, at any depth (lazy ones too), except of a
    package's __init__ (importing a name from a package is importing it from the file that defines it)."""
    paths = {_module_name(path): path for path in PACKAGE.rglob("*.py")}
    found = []
    for module, path in sorted(paths.items()):
        text = path.read_text()
        for node in ast.walk(ast.parse(text, filename=str(path))):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            source = " ".join(ast.get_source_segment(text, node).split())
            for target in _file_targets(node, module, path.name == "__init__.py", set(paths)):
                while target not in paths and "." in target:  # `import a.b.name`: the file is a.b
                    target = target.rsplit(".", 1)[0]
                if target in paths and target != module and paths[target].name != "__init__.py":
                    found.append(Import(path, node.lineno, source, module, target))
    return found


def logicrl_imports() -> list[Import]:
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        module = _module_name(path)
        importer = _package_of(module)
        text = path.read_text()
        for node in ast.walk(ast.parse(text, filename=str(path))):
            if not isinstance(node, (ast.Import, ast.ImportFrom)):
                continue
            source = ast.get_source_segment(text, node)
            for target in _targets(node, module, path.name == "__init__.py"):
                imported = _package_of(target)
                if imported is not None and imported != importer:
                    found.append(Import(path, node.lineno, " ".join(source.split()), importer, imported))
    return found


def test_every_package_has_a_layer():
    packages = {p.name for p in PACKAGE.iterdir() if p.is_dir() and (p / "__init__.py").is_file()}
    unplaced = sorted(packages - LEVEL.keys())
    if unplaced:
        pytest.fail(f"logicrl packages with no layer in tests/test_layering.py's LAYERS: {unplaced}", pytrace=False)


def test_no_import_goes_up_or_sideways():
    top = len(LAYERS)  # a package with no layer counts as the top: nothing may import it
    bad = [imp for imp in logicrl_imports() if LEVEL.get(imp.imported, top) >= LEVEL.get(imp.importer, top)]
    order = "  <-  ".join(", ".join(layer) for layer in LAYERS)
    if bad:
        pytest.fail(f"{len(bad)} import(s) break DESIGN.md's layering ({order}; same-layer packages do not "
                    "import each other):\n" + "\n".join(f"  {imp}" for imp in bad), pytrace=False)


def test_no_import_cycles_between_packages():
    _fail_on_cycles(logicrl_imports(), "packages")


def test_no_import_cycles_between_files():
    _fail_on_cycles(file_imports(), "files")


def _fail_on_cycles(imports: list[Import], what: str) -> None:
    edges: dict[str, dict[str, Import]] = {}
    for imp in imports:
        edges.setdefault(imp.importer, {}).setdefault(imp.imported, imp)  # first import names the edge
    cycles = _cycles({a: set(bs) for a, bs in edges.items()})
    lines = []
    for cycle in cycles:
        lines.append("  " + " -> ".join([*cycle, cycle[0]]))
        lines += [f"      {edges[a][b]}" for a, b in zip(cycle, [*cycle[1:], cycle[0]])]
    if cycles:
        pytest.fail(f"{what} that import each other in a cycle (move the name one of them needs; a lazy import "
                    "hides a cycle, it does not remove it):\n" + "\n".join(lines), pytrace=False)


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """One cycle through each strongly connected group of two or more packages (Tarjan, then a walk)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    groups: list[set[str]] = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            group = set()
            while True:
                w = stack.pop()
                group.add(w)
                if w == v:
                    break
            if len(group) > 1:
                groups.append(group)

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_shortest_cycle(graph, group) for group in groups]


def _shortest_cycle(graph: dict[str, set[str]], group: set[str]) -> list[str]:
    """A shortest cycle through the group's first package (breadth first, inside the group)."""
    start = min(group)
    parent: dict[str, str] = {}
    frontier = [start]
    while frontier:
        following = []
        for v in frontier:
            for w in sorted(graph.get(v, ())):
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(parent[path[-1]])
                    return path[::-1]
                if w in group and w not in parent:
                    parent[w] = v
                    following.append(w)
        frontier = following
    raise AssertionError(f"{group} is not strongly connected")


def test_the_checker_sees_what_it_must():
    """Function-level, relative and `from logicrl import x` imports are all resolved to packages."""
    tree = ast.parse("def f():\n    from logicrl.trainer.faults import maybe_fail\n"
                     "from . import fsdp\nfrom ..memory import planner\nfrom logicrl import rng, config\n")
    found = [(n.lineno, _package_of(t)) for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
             for t in _targets(n, "logicrl.workers.micro", is_package=False)]
    assert sorted(found) == [(2, "trainer"), (3, "workers"), (4, "memory"), (5, "config"), (5, TOP_LEVEL)]
    assert _cycles({"a": {"b"}, "b": {"c", "a"}, "c": {"a"}, "d": {"a"}}) == [["a", "b"]]
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_file_checker_sees_what_it_must():
    """`from package import module`, `from module import name`, relative and lazy imports each reach a file."""
    modules = {"logicrl.workers", "logicrl.workers.oom", "logicrl.workers.fsdp", "logicrl.memory.fit"}
    tree = ast.parse("def f():\n    from logicrl.workers.oom import MicroSize\n"
                     "from logicrl.workers import fsdp, hybrid\nfrom ..memory.fit import X\n"
                     "import logicrl.workers.fsdp\n")
    found = sorted((n.lineno, t) for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
                   for t in _file_targets(n, "logicrl.workers.micro", False, modules))
    assert found == [(2, "logicrl.workers.oom"), (3, "logicrl.workers"), (3, "logicrl.workers.fsdp"),
                     (4, "logicrl.memory.fit"), (5, "logicrl.workers.fsdp")]
