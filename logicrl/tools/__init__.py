"""Tools a model calls during a multi-turn rollout: the call and result types, the hermes parser, the
loader for verl's tool YAML and for plain Python functions, the runner (parallel, timed, never
raising for a tool's failure), and two built-ins, `calculator` and a sandboxed `code_interpreter`.
A low layer: nothing here imports the workers or the trainer. docs/tools.md is the manual.
"""

from logicrl.tools.base import ERROR_KINDS, Tool, ToolCall, ToolConfigError, ToolResult
from logicrl.tools.loading import load_tools, load_tools_from
from logicrl.tools.parse import parse_hermes
from logicrl.tools.runner import ToolRunner

__all__ = ["ERROR_KINDS", "Tool", "ToolCall", "ToolConfigError", "ToolResult", "ToolRunner", "load_tools",
           "load_tools_from", "parse_hermes"]
