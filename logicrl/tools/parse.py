"""Tool calls out of an assistant turn's text, in the hermes format (verl's `multi_turn.format: hermes`,
Qwen's chat templates):

    <tool_call>
    {"name": "calculator", "arguments": {"expr": "2**10"}}
    </tool_call>

Several calls per turn, in order. A block that is not a JSON object naming a tool comes back as a
ToolCall with `raw` set, so the runner answers it with an error the model can learn from rather than
dropping it. An unclosed `<tool_call>` (a turn cut by the length budget) is not a call, as in verl.
"""

from __future__ import annotations

import json
import re

from logicrl.tools.base import ToolCall

TOOL_CALL_RE = re.compile(r"<tool_call>(.*?)</tool_call>", re.DOTALL)


def parse_hermes(text: str) -> list[ToolCall]:
    return [_parse_one(block.strip()) for block in TOOL_CALL_RE.findall(text)]


def _parse_one(block: str) -> ToolCall:
    try:
        obj = json.loads(block)
    except ValueError:
        return ToolCall(name="", arguments={}, raw=block)
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str) or not obj["name"]:
        return ToolCall(name="", arguments={}, raw=block)
    arguments = obj.get("arguments", obj.get("parameters"))
    if arguments is None:
        arguments = {}
    if isinstance(arguments, str):
        # Some models write the arguments as a JSON string (OpenAI's wire format): accept it.
        try:
            arguments = json.loads(arguments) if arguments.strip() else {}
        except ValueError:
            return ToolCall(name=obj["name"], arguments={}, raw=block)
    if not isinstance(arguments, dict):
        return ToolCall(name=obj["name"], arguments={}, raw=block)
    return ToolCall(name=obj["name"], arguments=arguments)
