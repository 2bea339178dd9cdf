"""Tools from their declarations: verl's tool YAML (`tool_config_path`), a Python file of plain
functions (`function_tool_path`), or, with neither, the two built-ins (`calculator`, `code_interpreter`).

    tools:
      - class_name: logicrl.tools.code_interpreter.CodeInterpreter
        config: {default_timeout: 10, memory_limit_mb: 512}
        tool_schema: {type: function, function: {name: code_interpreter, description: ..., parameters: ...}}

A class is built as `cls(config=..., tool_schema=...)` (verl's constructor) and named by its schema.
verl's SandboxFusionTool, retool's CustomSandboxFusionTool and the GSM8K example's Gsm8kTool map to
logicrl classes reading the same keys (VERL_CLASSES); functions.py loads function files.
Everything wrong is one ToolConfigError line naming the file and the fix, raised before anything runs.
"""

from __future__ import annotations

import importlib
from pathlib import Path

import yaml

from logicrl.tools.base import Tool, ToolConfigError
from logicrl.tools.functions import load_function_tools
from logicrl.tools.schema import SchemaError, check_declared_schema

# verl's (and verl-recipe's) tool classes whose logicrl equivalent reads the same config and arguments.
VERL_CLASSES = {
    "verl.tools.sandbox_fusion_tools.SandboxFusionTool": "logicrl.tools.code_interpreter.CodeInterpreter",
    "recipe.retool.retool.CustomSandboxFusionTool": "logicrl.tools.code_interpreter.RetoolCodeInterpreter",
    "verl.tools.gsm8k_tool.Gsm8kTool": "logicrl.tools.gsm8k.Gsm8kTool",
    "recipe.partial_rollout.tools.gsm8k_tool.Gsm8kTool": "logicrl.tools.gsm8k.Gsm8kTool",
}
BUILTIN_CLASSES = ("logicrl.tools.calculator.Calculator", "logicrl.tools.code_interpreter.CodeInterpreter")


def load_tools(tool_config_path: str | None = None, function_tool_path: str | None = None) -> dict[str, Tool]:
    if tool_config_path is None and function_tool_path is None:
        return _named([_build(cls, {}, None, "the built-in tools") for cls in BUILTIN_CLASSES], "the built-in tools")
    tools: list[Tool] = []
    if tool_config_path is not None:
        tools += _from_yaml(Path(tool_config_path))
    if function_tool_path is not None:
        tools += load_function_tools(Path(function_tool_path))
    where = " and ".join(f"{key}={p}" for key, p in (("tool_config_path", tool_config_path),
                                                      ("function_tool_path", function_tool_path)) if p is not None)
    return _named(tools, where)


def load_tools_from(path: str | None) -> dict[str, Tool]:
    """One CONFIG as the command line takes it: a .py file of function tools, else a tool YAML."""
    if path is None:
        return load_tools()
    return load_tools(function_tool_path=path) if path.endswith(".py") else load_tools(tool_config_path=path)


def _named(tools: list[Tool], where: str) -> dict[str, Tool]:
    out: dict[str, Tool] = {}
    for tool in tools:
        if tool.name in out:
            raise ToolConfigError(f"{where}: two tools are named {tool.name!r}; tool names must be unique")
        out[tool.name] = tool
    return out


def _from_yaml(path: Path) -> list[Tool]:
    key = f"tool_config_path={path}"
    if not path.is_file():
        raise ToolConfigError(f"{key}: no such file (point it at a tool YAML with a `tools:` list)")
    try:
        doc = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise ToolConfigError(f"{key}: not valid YAML ({' '.join(str(exc).split())[:200]})") from None
    entries = doc.get("tools") if isinstance(doc, dict) else None
    if not isinstance(entries, list) or not entries:
        raise ToolConfigError(f"{key}: expected a top-level `tools:` list of {{class_name, config, tool_schema}}")
    tools = []
    for i, entry in enumerate(entries):
        where = f"{key} tools[{i}]"
        if not isinstance(entry, dict) or not isinstance(entry.get("class_name"), str):
            raise ToolConfigError(f"{where}: each tool needs `class_name` (e.g. logicrl.tools.calculator.Calculator)")
        unknown = sorted(set(entry) - {"class_name", "config", "tool_schema"})
        if unknown:
            raise ToolConfigError(f"{where}: unknown key(s) {unknown}; a tool has class_name, config, tool_schema")
        config = entry.get("config") or {}
        if not isinstance(config, dict):
            raise ToolConfigError(f"{where}: `config` must be a mapping, got {type(config).__name__}")
        schema = entry.get("tool_schema")
        if schema is not None:
            try:
                check_declared_schema(schema)
            except SchemaError as exc:
                raise ToolConfigError(f"{where}: {exc}") from None
        tools.append(_build(entry["class_name"], config, schema, where))
    return tools


def _build(class_name: str, config: dict, schema: dict | None, where: str) -> Tool:
    target = VERL_CLASSES.get(class_name, class_name)
    module_name, _, attr = target.rpartition(".")
    try:
        cls = getattr(importlib.import_module(module_name), attr, None) if module_name else None
    except ModuleNotFoundError as exc:
        if exc.name is None or not (module_name == exc.name or module_name.startswith(exc.name + ".")):
            # the module exists; something it imports does not
            raise ToolConfigError(f"{where}: importing {module_name} failed ({exc})") from None
        cls = None
    except Exception as exc:
        raise ToolConfigError(f"{where}: importing {module_name} failed ({type(exc).__name__}: {exc})") from None
    if cls is None:
        hint = (" (a verl tool class; logicrl maps only " + ", ".join(VERL_CLASSES) + ")"
                if class_name.startswith("verl.") else "")
        raise ToolConfigError(f"{where}: class_name {class_name!r} cannot be imported{hint}; logicrl's tools are "
                              f"{', '.join(BUILTIN_CLASSES)}, or give an importable module.Class")
    try:
        tool = cls(config=dict(config), tool_schema=schema)
    except ToolConfigError as exc:
        raise ToolConfigError(f"{where}: {exc}") from None
    except Exception as exc:
        raise ToolConfigError(f"{where}: {class_name}(config=..., tool_schema=...) failed: "
                              f"{type(exc).__name__}: {exc}") from None
    if not (isinstance(getattr(tool, "name", None), str) and isinstance(getattr(tool, "schema", None), dict)
            and callable(getattr(tool, "call", None))):
        raise ToolConfigError(f"{where}: {class_name} is not a logicrl tool (it needs `name`, `schema` and "
                              "`call(arguments, **kwargs) -> ToolResult`; see docs/tools.md)")
    try:
        check_declared_schema(tool.schema)
    except SchemaError as exc:
        raise ToolConfigError(f"{where}: {exc}") from None
    return tool
