"""The calculator: exact arithmetic on the syntax tree, refusals (not crashes) for everything else,
and sizes refused before they are computed."""

import time

import pytest

from logicrl.tools.calculator import MAX_BITS, CalcError, Calculator, evaluate, format_number


@pytest.mark.parametrize("expr, value", [
    ("2**10 + 7*3", 1045), ("(37 * 91) % 17", 3367 % 17), ("-3 // 2", -2), ("7 / 2", 3.5), ("+5 - -5", 10),
    ("123456789 * 987654321", 121932631112635269), ("2 ** -2", 0.25), ("10 % 3 ** 2", 1), ("1e3 + 0.5", 1000.5),
])
def test_arithmetic(expr, value):
    assert evaluate(expr) == value


@pytest.mark.parametrize("expr, message", [
    ("__import__('os').system('true')", "not Call"), ("x + 1", "not Name"), ("'a' * 3", "only numbers"),
    ("True + 1", "only numbers"), ("2 ^ 10", "write **"), ("1 / 0", "division by zero"), ("1 +", "not an arithmetic"),
    ("(1).__class__", "not Attribute"), ("[1, 2]", "not List"), ("1 << 3", "not BinOp"), ("2 ** 0.5j", "only numbers"),
    ("(-8) ** (1/3)", "not a real number"), ("1e308 * 10", "finite"), ("10.0 ** 400", "too large for a float"),
])
def test_refusals(expr, message):
    with pytest.raises(CalcError, match=message.replace("*", r"\*").replace("(", r"\(")):
        format_number(evaluate(expr))


def test_sizes_are_refused_before_computing():
    start = time.monotonic()
    for expr in ("9**9**9", "2**100000", f"2**{MAX_BITS + 1}", "(10**1000) * 10**300", "1.5 ** 10**9"):
        with pytest.raises(CalcError, match="too large"):
            evaluate(expr)
    assert time.monotonic() - start < 1.0
    assert evaluate(f"2**{MAX_BITS}") == 1 << MAX_BITS  # the bound itself is allowed
    with pytest.raises(CalcError, match="characters"):
        evaluate("1+" * 600 + "1")


def test_deep_nesting_is_an_answer_or_an_error_never_a_crash():
    try:
        value = evaluate("-" * 999 + "1")  # 999 nested unary minus: past the interpreter's recursion limit
    except CalcError as exc:
        assert "nested too deeply" in str(exc)
    else:
        assert value == -1


def test_tool_results():
    calc = Calculator()
    assert calc.name == "calculator" and calc.schema["function"]["parameters"]["required"] == ["expr"]
    ok = calc.call({"expr": "6*7"})
    assert (ok.text, ok.ok, ok.error) == ("42", True, None)
    bad = calc.call({"expr": "6*x"})
    assert (bad.ok, bad.error) == (False, "bad_arguments") and bad.text.startswith("Error (bad_arguments): only")
