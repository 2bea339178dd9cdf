"""load_tools: the built-ins, verl's tool YAML, plain-function files with derived schemas, and one
ToolConfigError line (a BadInput) for each way a declaration can be wrong."""

import sys
import textwrap
from typing import Literal, Optional

import pytest

from logicrl.errors import BadInput
from logicrl.tools import ToolConfigError, load_tools, load_tools_from
from logicrl.tools.schema import SchemaError, argument_errors, schema_from_function


def test_builtins():
    tools = load_tools(None, None)
    assert sorted(tools) == ["calculator", "code_interpreter"]
    assert tools["code_interpreter"].schema["function"]["parameters"]["required"] == ["code"]


def _yaml(tmp_path, text):
    path = tmp_path / "tools.yaml"
    path.write_text(textwrap.dedent(text))
    return str(path)


def test_verl_yaml_renames_a_builtin_and_maps_verls_sandbox_class(tmp_path):
    path = _yaml(tmp_path, """
        tools:
          - class_name: logicrl.tools.calculator.Calculator
            config: {type: native}
            tool_schema:
              type: function
              function:
                name: calc
                description: arithmetic
                parameters: {type: object, properties: {expr: {type: string}}, required: [expr]}
          - class_name: verl.tools.sandbox_fusion_tools.SandboxFusionTool
            config: {sandbox_fusion_url: "http://127.0.0.1:9/run_code", num_workers: 2, rate_limit: 2,
                     default_timeout: 5, memory_limit_mb: 512, type: native}
            tool_schema:
              type: function
              function:
                name: code_interpreter
                description: run code
                parameters: {type: object, properties: {code: {type: string}}, required: [code]}
        """)
    tools = load_tools(path, None)
    assert sorted(tools) == ["calc", "code_interpreter"]
    assert tools["calc"].call({"expr": "3*4"}).text == "12"
    assert tools["code_interpreter"].url == "http://127.0.0.1:9/run_code"
    assert tools["code_interpreter"].limits.memory_mb == 512


@pytest.mark.parametrize("body, message", [
    ("tools: []", "top-level `tools:` list"),
    ("tools:\n  - config: {}", "needs `class_name`"),
    ("tools:\n  - class_name: nowhere.Tool", "'nowhere.Tool' cannot be imported"),
    ("tools:\n  - class_name: logicrl.tools.calculator.Nope", "cannot be imported"),
    ("tools:\n  - class_name: verl.tools.search_tool.SearchTool", "a verl tool class"),
    ("tools:\n  - class_name: logicrl.tools.calculator.Calculator\n    schema: {}", "unknown key(s) ['schema']"),
    ("tools:\n  - class_name: logicrl.tools.calculator.Calculator\n    tool_schema: {type: function}",
     "tool_schema must be"),
    ("tools:\n  - class_name: logicrl.tools.calculator.Calculator\n    tool_schema: {type: function, function: "
     "{name: c, parameters: {type: object, properties: {a: {type: str}}}}}", "type 'str', not a JSON type"),
    ("tools:\n  - class_name: logicrl.tools.calculator.Calculator\n    tool_schema: {type: function, function: "
     "{name: c, parameters: {type: object, properties: {}, required: [a]}}}", "required ['a'] not among"),
    ("tools:\n  - class_name: logicrl.tools.code_interpreter.CodeInterpreter\n    config: {timeout: 3}",
     "unknown key(s) ['timeout']"),
    ("tools:\n  - class_name: logicrl.tools.calculator.Calculator\n  - class_name: logicrl.tools.calculator.Calculator",
     "two tools are named 'calculator'"),
    ("tools: [", "not valid YAML"),
    ("tools:\n  - class_name: logicrl.tools.base.ToolResult", "failed"),
    ("tools:\n  - class_name: collections.OrderedDict", "not a logicrl tool"),
])
def test_yaml_refusals_are_one_line(tmp_path, body, message):
    path = _yaml(tmp_path, body)
    with pytest.raises(ToolConfigError) as info:
        load_tools(path, None)
    assert isinstance(info.value, BadInput) and "\n" not in str(info.value)
    assert str(info.value).startswith(f"tool_config_path={path}") and message in str(info.value)


def test_a_tool_module_whose_own_import_fails_says_so(tmp_path, monkeypatch):
    (tmp_path / "my_tool_mod.py").write_text("import not_installed_dependency\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    path = _yaml(tmp_path, "tools:\n  - class_name: my_tool_mod.Tool\n")
    with pytest.raises(ToolConfigError, match="my_tool_mod failed .No module named 'not_installed_dependency'"):
        load_tools(path, None)


def test_missing_files(tmp_path):
    with pytest.raises(ToolConfigError, match="no such file"):
        load_tools(str(tmp_path / "absent.yaml"), None)
    with pytest.raises(ToolConfigError, match="no such Python file"):
        load_tools(None, str(tmp_path / "absent.py"))


FUNCTIONS = '''
from typing import Literal, Optional

def lookup(city: str, unit: Literal["c", "f"] = "c", days: Optional[int] = None, **kwargs) -> str:
    """Look up a forecast.

    Args:
        city: The city's name.
        unit: Degrees Celsius or Fahrenheit.
        days: How many days ahead,
            counting today.
    Returns:
        The forecast.
    """
    return f"{city}:{unit}:{days}:{kwargs.get('region')}"

def table(n: int) -> dict:
    """A table of squares.

    Args:
        n: How many.
    """
    return {str(i): i * i for i in range(n)}

def _helper(x):
    return x
'''


def test_function_tools_schema_and_calls(tmp_path):
    path = tmp_path / "fns.py"
    path.write_text(FUNCTIONS)
    tools = load_tools_from(str(path))
    assert sorted(tools) == ["lookup", "table"]
    fn = tools["lookup"].schema["function"]
    assert fn["description"] == "Look up a forecast."
    assert fn["parameters"] == {"type": "object", "required": ["city"], "properties": {
        "city": {"type": "string", "description": "The city's name."},
        "unit": {"type": "string", "enum": ["c", "f"], "description": "Degrees Celsius or Fahrenheit."},
        "days": {"type": "integer", "nullable": True, "description": "How many days ahead, counting today."}}}
    # The row's tools_kwargs reach a function that takes **kwargs.
    assert tools["lookup"].call({"city": "Oslo"}, region="north").text == "Oslo:c:None:north"
    assert tools["table"].call({"n": 3}, region="ignored").text == '{"0": 0, "1": 1, "2": 4}'


@pytest.mark.parametrize("source, message", [
    ("def f(x):\n    '''Do.\n\n    Args:\n        x: a thing.\n    '''\n", "no type hint for argument `x`"),
    ("def f(x: int):\n    return x\n", "`f` has no docstring"),
    ("def f(x: int):\n    '''Do.'''\n", "does not describe argument `x`"),
    ("def f(x: set[bytes]):\n    '''Do.\n\n    Args:\n        x: a thing.\n    '''\n", "has no JSON equivalent"),
    ("import os\n", "defines no public function"),
    ("raise RuntimeError('at import')\n", "importing it failed (RuntimeError: at import)"),
])
def test_function_refusals(tmp_path, source, message):
    path = tmp_path / "fns.py"
    path.write_text(source)
    with pytest.raises(ToolConfigError) as info:
        load_tools(None, str(path))
    assert "\n" not in str(info.value) and str(info.value).startswith(f"function_tool_path={path}")
    assert message in str(info.value)


def test_schema_types_and_argument_checks():
    def f(a: list[int], b: dict[str, float], c: int | str, d: Optional[bool] = None,  # noqa: UP045
          e: Literal[1, 2] = 1) -> None:
        """Summary.

        Args:
            a: A.
            b: B.
            c: C.
            d: D.
            e: E.
        """

    schema = schema_from_function(f)
    props = schema["function"]["parameters"]["properties"]
    assert props["a"]["items"] == {"type": "integer"} and props["b"]["additionalProperties"] == {"type": "number"}
    assert props["c"]["type"] == ["integer", "string"] and props["e"] == {"enum": [1, 2], "type": "integer",
                                                                         "description": "E."}
    assert argument_errors(schema, {"a": [1], "b": {}, "c": 3}) is None
    assert "missing required argument(s) c" in argument_errors(schema, {"a": [1], "b": {}})
    assert "unknown argument(s) z" in argument_errors(schema, {"a": [], "b": {}, "c": 1, "z": 0})
    assert "`a` must be array, got str" in argument_errors(schema, {"a": "x", "b": {}, "c": 1})
    assert "`c` must be integer or string, got bool" in argument_errors(schema, {"a": [], "b": {}, "c": True})
    assert "`e` must be one of [1, 2]" in argument_errors(schema, {"a": [], "b": {}, "c": 1, "e": 3})
    assert argument_errors(schema, {"a": [], "b": {}, "c": 1, "d": None}) is None
    with pytest.raises(SchemaError, match="summary line"):
        schema_from_function(_args_only)


def _args_only(x: int):
    """
    Args:
        x: a thing.
    """


VERL_FILE = '''
import asyncio

from verl.tools.function_tool import function_tool


@function_tool
def get_weather(city: str) -> dict:
    """Get the current weather for a city.

    Args:
        city: The city to look up.
    """
    return {"city": city, "temperature_c": 17.3}


@function_tool("add")
async def add_numbers(a: int, b: int) -> str:
    """Add two integers.

    Args:
        a: First.
        b: Second.
    """
    await asyncio.sleep(0)
    return str(a + b), 0.5, {"calls": 1}


def not_a_tool(x: int) -> int:
    """Not decorated: left out, since the file marks its tools.

    Args:
        x: x.
    """
    return x
'''


def test_a_verl_function_tool_file_loads_unchanged(tmp_path):
    path = tmp_path / "verl_tools.py"
    path.write_text(VERL_FILE)
    tools = load_tools(None, str(path))
    assert sorted(tools) == ["add", "get_weather"]  # the decorated ones, renamed where asked
    assert tools["add"].schema["function"]["name"] == "add"
    assert tools["add"].call({"a": 2, "b": 3}).text == "5"  # async, and a (response, reward, metrics) tuple
    assert tools["get_weather"].call({"city": "Oslo"}).text == '{"city": "Oslo", "temperature_c": 17.3}'
    assert "verl.tools.function_tool" not in sys.modules  # the stand-in lived only while the file loaded


def test_verl_example_configs_map_to_logicrl_tools(tmp_path):
    path = _yaml(tmp_path, """
        tools:
          - class_name: "recipe.retool.retool.CustomSandboxFusionTool"
            config: {sandbox_fusion_url: "http://localhost:8080/run_code", num_workers: 128,
                     enable_global_rate_limit: true, rate_limit: 128, default_timeout: 30,
                     default_language: "python", memory_limit_mb: 1024, type: native}
            tool_schema:
              type: "function"
              function:
                name: "code_interpreter"
                description: "A tool for executing code."
                parameters: {type: "object", properties: {code: {type: "string", description: "The code."}},
                             required: ["code"]}
          - class_name: "verl.tools.gsm8k_tool.Gsm8kTool"
            config: {type: native}
            tool_schema:
              type: "function"
              function:
                name: "calc_gsm8k_reward"
                description: "A tool for calculating the reward of gsm8k."
                parameters: {type: "object", properties: {answer: {type: "string", description: "answer"}},
                             required: ["answer"]}
        """)
    tools = load_tools(path, None)
    ci, gsm = tools["code_interpreter"], tools["calc_gsm8k_reward"]
    assert (ci.extract_code_block, ci.print_last_expression, ci.limits.timeout_s) == (True, True, 30.0)
    assert gsm.call({"answer": "72"}, ground_truth="72").text == "Current parsed answer='72' reward=1.0"
    assert gsm.call({"answer": "#### 1,000"}, ground_truth="1000").text == (
        "Current parsed answer='#### 1,000' reward=0.0")  # verl's flexible match keeps the comma
    assert gsm.call({"answer": "none"}, ground_truth="7").text == "Current parsed answer='none' reward=0"
    missing = gsm.call({"answer": "72"})
    assert (missing.ok, missing.error) == (False, "missing_kwargs")
