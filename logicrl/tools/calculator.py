"""The `calculator` tool: an arithmetic expression evaluated on its syntax tree, never with `eval`.

Only numbers, + - * / // % ** and unary signs are allowed (`eval` with empty builtins can still be
escaped through attribute chains; a whitelist of nodes cannot). Sizes are bounded before they are
computed: the expression's length, an exponent's size, and an integer result's bits (a product or a
power predicted past MAX_BITS is refused, not computed), so `9**9**9` is an error in microseconds.
"""

from __future__ import annotations

import ast
import math
import operator
from typing import Any

from logicrl.tools.base import ToolResult, function_schema

MAX_EXPR_CHARS = 1000
MAX_BITS = 4096  # ~1233 decimal digits: room for any honest arithmetic, none for a memory bomb
MAX_RESULT_CHARS = 1300

_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.Div: operator.truediv,
           ast.FloorDiv: operator.floordiv, ast.Mod: operator.mod, ast.Pow: operator.pow}
_UNARY = {ast.UAdd: operator.pos, ast.USub: operator.neg}


class CalcError(ValueError):
    """Why an expression is refused; the message is what the model reads."""


def evaluate(expr: str) -> int | float:
    if len(expr) > MAX_EXPR_CHARS:
        raise CalcError(f"the expression is {len(expr)} characters; at most {MAX_EXPR_CHARS}")
    try:
        tree = ast.parse(expr.strip(), mode="eval")
    except SyntaxError as exc:
        raise CalcError(f"not an arithmetic expression ({exc.msg})") from None
    except (RecursionError, MemoryError, ValueError):
        raise CalcError("the expression is nested too deeply") from None
    try:
        return _eval(tree.body)
    except RecursionError:
        raise CalcError("the expression is nested too deeply") from None
    except ZeroDivisionError:
        raise CalcError("division by zero") from None
    except OverflowError:
        raise CalcError("the result is too large for a float") from None


def _eval(node: ast.AST) -> int | float:
    if isinstance(node, ast.Constant):
        if isinstance(node.value, bool) or not isinstance(node.value, (int, float)):
            raise CalcError(f"only numbers are allowed, got {node.value!r}")
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNARY:
        return _UNARY[type(node.op)](_eval(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINARY:
        left, right = _eval(node.left), _eval(node.right)
        _check_size(type(node.op), left, right)
        return _BINARY[type(node.op)](left, right)
    if isinstance(node, ast.BinOp) and isinstance(node.op, ast.BitXor):
        raise CalcError("^ is not a power here: write ** (2**10)")
    raise CalcError(f"only numbers and + - * / // % ** are allowed, not {type(node).__name__}")


def _bits(x: int | float) -> int:
    return abs(x).bit_length() if isinstance(x, int) else 0


def _check_size(op: type, left: int | float, right: int | float) -> None:
    """Refuse, before computing it, an integer result past MAX_BITS (floats overflow on their own)."""
    if op is ast.Pow:
        if isinstance(right, int) and isinstance(left, int) and abs(left) > 1:
            if right > MAX_BITS or math.log2(abs(left)) * right > MAX_BITS:
                raise CalcError(f"the power is too large (more than {MAX_BITS} bits)")
        elif abs(right) > 10 * MAX_BITS and abs(left) not in (0, 1):
            # float powers overflow by themselves, but a huge int exponent on a float base is slow to reach it
            raise CalcError(f"the exponent {right!r} is too large")
    elif op is ast.Mult and isinstance(left, int) and isinstance(right, int):
        if _bits(left) + _bits(right) > MAX_BITS + 1:
            raise CalcError(f"the product is too large (more than {MAX_BITS} bits)")


def format_number(value: int | float) -> str:
    if isinstance(value, complex):  # (-8) ** (1/3): Python answers with a complex number
        raise CalcError("the result is not a real number (a fractional power of a negative number)")
    if isinstance(value, float) and (math.isnan(value) or math.isinf(value)):
        raise CalcError("the result is not a finite number")
    text = str(value)
    if len(text) > MAX_RESULT_CHARS:
        raise CalcError(f"the result has {len(text)} characters; at most {MAX_RESULT_CHARS}")
    return text


class Calculator:
    """Tool class for verl-style YAML: `class_name: logicrl.tools.calculator.Calculator`."""

    def __init__(self, config: dict[str, Any] | None = None, tool_schema: dict[str, Any] | None = None):
        self.schema = tool_schema or function_schema(
            "calculator", "Evaluate an arithmetic expression exactly (numbers, + - * / // % ** and parentheses).",
            {"expr": {"type": "string", "description": "The expression, e.g. (37 * 91) % 17"}}, ["expr"])
        self.name = self.schema["function"]["name"]
        self.config = dict(config or {})

    def call(self, arguments: dict[str, Any], **kwargs: Any) -> ToolResult:
        expr = arguments.get("expr")
        if not isinstance(expr, str):
            return ToolResult.failure("bad_arguments", f"{self.name} needs `expr`, a string")
        try:
            return ToolResult.success(format_number(evaluate(expr)))
        except CalcError as exc:
            return ToolResult.failure("bad_arguments", str(exc))
