"""parse_hermes: several calls per turn in order, arguments as an object or a JSON string, and every
malformed block kept (with `raw`) so the runner can answer it."""

from logicrl.tools import ToolCall, parse_hermes


def test_calls_in_order_with_text_around_them():
    text = ('Let me compute.\n<tool_call>\n{"name": "calculator", "arguments": {"expr": "2+2"}}\n</tool_call>\n'
            'and\n<tool_call>{"name": "code_interpreter", "arguments": {"code": "print(1)"}}</tool_call> done')
    assert parse_hermes(text) == [ToolCall("calculator", {"expr": "2+2"}),
                                  ToolCall("code_interpreter", {"code": "print(1)"})]


def test_no_call_and_an_unclosed_call_are_no_calls():
    assert parse_hermes("The answer is 4.") == []
    assert parse_hermes('<tool_call>{"name": "calculator", "arguments": {"expr": "1"}}') == []


def test_arguments_as_a_json_string_missing_or_null():
    as_string = '<tool_call>{"name": "f", "arguments": "{\\"x\\": 1}"}</tool_call>'
    assert parse_hermes(as_string) == [ToolCall("f", {"x": 1})]
    assert parse_hermes('<tool_call>{"name": "f"}</tool_call>') == [ToolCall("f", {})]
    assert parse_hermes('<tool_call>{"name": "f", "arguments": null}</tool_call>') == [ToolCall("f", {})]


def test_malformed_blocks_keep_their_text():
    calls = parse_hermes('<tool_call>{"name": "f", "arguments": {"x": 1}</tool_call>'  # a brace short
                         '<tool_call>["f"]</tool_call>'
                         '<tool_call>{"arguments": {}}</tool_call>'
                         '<tool_call>{"name": "f", "arguments": [1, 2]}</tool_call>')
    assert calls == [ToolCall("", {}, raw='{"name": "f", "arguments": {"x": 1}'), ToolCall("", {}, raw='["f"]'),
                     ToolCall("", {}, raw='{"arguments": {}}'),
                     ToolCall("f", {}, raw='{"name": "f", "arguments": [1, 2]}')]
