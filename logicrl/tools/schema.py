"""JSON schemas for tools: derived from a plain function (type hints plus a Google-style docstring, as
transformers' `get_json_schema` and TRL's `tools=[...]` do), checked when declared in a YAML, and used
to check a call's arguments before the tool runs (so a wrong argument is the model's error, named, not
a stack trace from inside the tool).

The argument check is deliberately a small subset of JSON Schema: required keys, no unknown keys,
the basic types and enums. That is what a model gets wrong; full validation would need a dependency.
"""

from __future__ import annotations

import inspect
import re
import types
import typing
from typing import Any, Literal, Union

JSON_TYPES = {"string": str, "integer": int, "number": (int, float), "boolean": bool, "array": list,
              "object": dict, "null": type(None)}
_PY_TO_JSON = {str: "string", int: "integer", float: "number", bool: "boolean", list: "array", dict: "object",
               type(None): "null"}
_ARGS_HEADER = re.compile(r"^\s*(Args|Arguments|Parameters)\s*:\s*$")
_OTHER_HEADER = re.compile(r"^\s*(Returns?|Raises|Yields|Examples?|Notes?)\s*:\s*$")
_ARG_LINE = re.compile(r"^\s*(\w+)\s*(\([^)]*\))?\s*:\s*(.*)$")


class SchemaError(ValueError):
    """Why a function or a declared schema cannot describe a tool (one line; the loader adds where)."""


def schema_from_function(fn: Any) -> dict[str, Any]:
    """The OpenAI function schema of `fn`: description from the docstring's summary, one property
    per parameter (type from its hint, description from the docstring's Args section), required =
    the parameters without defaults. Refuses a function missing any of those."""
    name = fn.__name__
    doc = inspect.getdoc(fn)
    if not doc:
        raise SchemaError(f"function `{name}` has no docstring (write one: a summary line, then an Args: "
                          "section describing each argument)")
    summary, arg_docs = _split_docstring(doc)
    if not summary:
        raise SchemaError(f"function `{name}`'s docstring has no summary line before its Args: section")
    try:
        hints = typing.get_type_hints(fn, include_extras=False)
    except Exception as exc:  # a hint naming something undefined
        raise SchemaError(f"function `{name}`: its type hints do not resolve ({exc})") from exc
    properties, required = {}, []
    for param in inspect.signature(fn).parameters.values():
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            continue  # **kwargs receive the row's tools_kwargs, not model arguments
        if param.name not in hints:
            raise SchemaError(f"function `{name}` has no type hint for argument `{param.name}` "
                              f"(write e.g. `{param.name}: str`)")
        if param.name not in arg_docs:
            raise SchemaError(f"function `{name}`'s docstring does not describe argument `{param.name}` "
                              f"(add `{param.name}: ...` under Args:)")
        prop = _json_type(hints[param.name], f"function `{name}` argument `{param.name}`")
        prop["description"] = arg_docs[param.name]
        properties[param.name] = prop
        if param.default is param.empty:
            required.append(param.name)
    return {"type": "function", "function": {
        "name": name, "description": summary,
        "parameters": {"type": "object", "properties": properties, "required": required}}}


def _split_docstring(doc: str) -> tuple[str, dict[str, str]]:
    summary_lines, args, current, section = [], {}, None, "summary"
    for line in doc.splitlines():
        if _ARGS_HEADER.match(line):
            section = "args"
            continue
        if _OTHER_HEADER.match(line):
            section = "other"
            continue
        if section == "summary":
            summary_lines.append(line.strip())
        elif section == "args":
            match = _ARG_LINE.match(line)
            if match:
                current = match.group(1)
                args[current] = match.group(3).strip()
            elif current and line.strip():
                args[current] += " " + line.strip()
    return " ".join(s for s in summary_lines if s).strip(), args


def _json_type(hint: Any, where: str) -> dict[str, Any]:
    if hint in _PY_TO_JSON:
        return {"type": _PY_TO_JSON[hint]}
    if hint is Any:
        return {}
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin is Literal:
        kinds = {_PY_TO_JSON.get(type(a)) for a in args}
        out: dict[str, Any] = {"enum": list(args)}
        if len(kinds) == 1 and None not in kinds:
            out["type"] = kinds.pop()
        return out
    if origin in (Union, types.UnionType):
        members = [a for a in args if a is not type(None)]
        inner = [_json_type(a, where) for a in members]
        if len(inner) == 1:
            out = dict(inner[0])
        elif all(set(i) == {"type"} and isinstance(i["type"], str) for i in inner):
            out = {"type": [i["type"] for i in inner]}
        else:
            out = {"anyOf": inner}
        if len(members) < len(args):
            out["nullable"] = True
        return out
    if origin in (list, tuple, set, frozenset):
        out = {"type": "array"}
        if args and args[-1] is not Ellipsis:
            out["items"] = _json_type(args[0], where)
        return out
    if origin is dict:
        out = {"type": "object"}
        if len(args) == 2:
            out["additionalProperties"] = _json_type(args[1], where)
        return out
    raise SchemaError(f"{where}: type hint {hint!r} has no JSON equivalent (use str, int, float, bool, list, "
                      "dict, Literal or Optional of these)")


def check_declared_schema(schema: Any) -> str:
    """The tool's name, or a SchemaError saying what a declared OpenAI function schema lacks."""
    if not isinstance(schema, dict) or schema.get("type") != "function" or not isinstance(
            schema.get("function"), dict):
        raise SchemaError('tool_schema must be {"type": "function", "function": {"name", "description", '
                          '"parameters"}}')
    fn = schema["function"]
    if not isinstance(fn.get("name"), str) or not re.fullmatch(r"[A-Za-z_][\w.-]*", fn["name"]):
        raise SchemaError(f"tool_schema.function.name must be an identifier, got {fn.get('name')!r}")
    params = fn.get("parameters", {"type": "object", "properties": {}})
    if not isinstance(params, dict) or params.get("type") != "object" or not isinstance(
            params.get("properties", {}), dict):
        raise SchemaError(f"tool `{fn['name']}`: tool_schema.function.parameters must be "
                          '{"type": "object", "properties": {...}, "required": [...]}')
    props = params.get("properties", {})
    missing = [r for r in params.get("required", []) or [] if r not in props]
    if missing:
        raise SchemaError(f"tool `{fn['name']}`: required {missing} not among its properties {sorted(props)}")
    for key, prop in props.items():
        kind = prop.get("type") if isinstance(prop, dict) else None
        for k in kind if isinstance(kind, list) else [kind]:
            if k is not None and k not in JSON_TYPES:
                raise SchemaError(f"tool `{fn['name']}`: property `{key}` has type {k!r}, not a JSON type "
                                  f"({', '.join(JSON_TYPES)})")
    return fn["name"]


def argument_errors(schema: dict[str, Any], arguments: dict[str, Any]) -> str | None:
    """What is wrong with `arguments` for this schema, in one sentence for the model; None if nothing."""
    params = schema["function"].get("parameters") or {}
    props = params.get("properties", {}) or {}
    missing = [r for r in params.get("required", []) or [] if r not in arguments]
    if missing:
        return f"missing required argument(s) {', '.join(missing)}; expected {_signature(props)}"
    unknown = [k for k in arguments if k not in props]
    if unknown and params.get("additionalProperties", False) is not True:
        return f"unknown argument(s) {', '.join(unknown)}; expected {_signature(props)}"
    for key, value in arguments.items():
        problem = _value_error(props.get(key) or {}, value)
        if problem:
            return f"argument `{key}` {problem}"
    return None


def _value_error(prop: dict[str, Any], value: Any) -> str | None:
    if "enum" in prop and value not in prop["enum"]:
        return f"must be one of {prop['enum']}, got {value!r}"
    kind = prop.get("type")
    if kind is None:
        return None
    kinds = kind if isinstance(kind, list) else [kind]
    if value is None and prop.get("nullable"):
        return None
    for k in kinds:
        py = JSON_TYPES.get(k)
        # bool is an int in Python, not in JSON: true is no integer.
        if py is not None and isinstance(value, py) and not (isinstance(value, bool) and k in ("integer", "number")):
            return None
    return f"must be {' or '.join(kinds)}, got {type(value).__name__} {_short(value)}"


def _signature(props: dict[str, Any]) -> str:
    return "{" + ", ".join(f"{k}: {p.get('type', 'any') if isinstance(p, dict) else 'any'}"
                           for k, p in props.items()) + "}"


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 40 else text[:37] + "..."
