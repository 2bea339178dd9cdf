"""Plain Python functions as tools (`function_tool_path`): the schema derived from type hints and the
docstring (schema.py), the return value turned into the text the model reads.

A file marks its tools with `@function_tool` (verl's decorator, same forms: bare, renamed, or with an
explicit schema); a file with no mark exposes its public functions (or its `__all__`), as TRL's
`tools=[...]` takes plain functions. A verl file's `from verl.tools.function_tool import function_tool`
works unchanged: where verl is not installed, that one module is provided while the file loads.
Function tools run in the trainer's process: they are the user's own code, not sandboxed.
"""

from __future__ import annotations

import asyncio
import importlib.util
import inspect
import json
import sys
import types
from collections.abc import Callable
from pathlib import Path
from typing import Any

from logicrl.tools.base import ToolConfigError, ToolResult
from logicrl.tools.schema import SchemaError, check_declared_schema, schema_from_function

_MARK = "__logicrl_function_tool__"


def function_tool(name: str | Callable | None = None, *, schema: dict | None = None):
    """Marks a function as a tool: `@function_tool`, `@function_tool("name")`, `@function_tool(schema=...)`."""

    def mark(fn: Callable, tool_name: str | None) -> Callable:
        setattr(fn, _MARK, {"name": tool_name or fn.__name__, "schema": schema})
        return fn

    if callable(name) and schema is None:
        return mark(name, None)
    return lambda fn: mark(fn, name if isinstance(name, str) else None)


class FunctionTool:
    """A function as a tool: arguments by keyword; the row's tools_kwargs only to a function that
    takes **kwargs (a logicrl addition: verl passes function tools no row kwargs)."""

    def __init__(self, fn: Callable, schema: dict[str, Any]):
        self.fn, self.schema, self.name = fn, schema, schema["function"]["name"]
        self._takes_kwargs = any(p.kind is p.VAR_KEYWORD for p in inspect.signature(fn).parameters.values())

    def call(self, arguments: dict[str, Any], **kwargs: Any) -> ToolResult:
        out = self.fn(**arguments, **(kwargs if self._takes_kwargs else {}))
        if inspect.iscoroutine(out):  # an async tool: the runner's thread has no loop of its own
            out = asyncio.run(out)
        return to_result(out)


def to_result(out: Any) -> ToolResult:
    """verl's return shapes: a string, a dict (as JSON), an object with `.text` (verl's ToolResponse),
    or a (response, reward[, metrics]) tuple whose response the model sees; anything else as str()."""
    if isinstance(out, tuple):
        if not 1 <= len(out) <= 3:
            raise TypeError(f"a function tool's tuple must be (response, reward[, metrics]), got {len(out)} items")
        out = out[0]
    if isinstance(out, ToolResult):
        return out
    if out is None:
        return ToolResult.success("")
    if isinstance(out, str):
        return ToolResult.success(out)
    if isinstance(getattr(out, "text", None), str):
        return ToolResult.success(out.text)
    if isinstance(out, (dict, list)):
        return ToolResult.success(json.dumps(out, ensure_ascii=False, default=str))
    return ToolResult.success(str(out))


def load_function_tools(path: Path) -> list[FunctionTool]:
    key = f"function_tool_path={path}"
    if not path.is_file() or path.suffix != ".py":
        raise ToolConfigError(f"{key}: no such Python file (point it at a .py file of tool functions)")
    spec = importlib.util.spec_from_file_location(f"logicrl_function_tools_{path.stem}", path)
    module = importlib.util.module_from_spec(spec)
    shim = _verl_shim()
    added = [name for name in shim if name not in sys.modules]
    sys.modules.update({name: shim[name] for name in added})
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        raise ToolConfigError(f"{key}: importing it failed ({type(exc).__name__}: {exc})") from None
    finally:
        for name in added:
            sys.modules.pop(name, None)
    marked = [v for v in vars(module).values() if callable(v) and hasattr(v, _MARK)]
    if marked:
        chosen = marked
    else:
        names = getattr(module, "__all__", None)
        if names is None:
            names = [n for n, v in vars(module).items() if inspect.isfunction(v) and not n.startswith("_")
                     and v.__module__ == module.__name__]
        chosen = [getattr(module, n, None) for n in names]
        bad = [n for n, fn in zip(names, chosen) if not callable(fn)]
        if bad:
            raise ToolConfigError(f"{key}: __all__ names {bad[0]!r}, which is not a function")
    if not chosen:
        raise ToolConfigError(f"{key}: defines no public function to use as a tool")
    tools = []
    for fn in chosen:
        mark = getattr(fn, _MARK, None) or {"name": None, "schema": None}
        try:
            if mark["schema"] is not None:
                check_declared_schema(mark["schema"])
                schema = mark["schema"]
            else:
                schema = schema_from_function(fn)
        except SchemaError as exc:
            raise ToolConfigError(f"{key}: {exc}") from None
        if mark["name"]:
            schema = {**schema, "function": {**schema["function"], "name": mark["name"]}}
        tools.append(FunctionTool(fn, schema))
    return tools


def _verl_shim() -> dict[str, types.ModuleType]:
    """`verl.tools.function_tool` with this module's decorator, where verl itself is not installed."""
    try:
        if importlib.util.find_spec("verl") is not None:
            return {}
    except ValueError:  # a `verl` module without a spec: leave it be
        return {}
    mods = {name: types.ModuleType(name) for name in ("verl", "verl.tools", "verl.tools.function_tool")}
    mods["verl.tools.function_tool"].function_tool = function_tool
    mods["verl"].tools = mods["verl.tools"]
    mods["verl.tools"].function_tool = mods["verl.tools.function_tool"]
    mods["verl"].__path__ = mods["verl.tools"].__path__ = []  # packages, so the submodule import resolves
    return mods
