"""What every tool and every caller of tools shares: a call as parsed from the model's text, the
result the model sees, the protocol a tool implements, and the one error a bad tool config raises.

A tool's failure is data, not an exception: `ToolResult(ok=False, error=KIND)` carries a short kind
(counted in metrics) and a text the model reads. Only a bad configuration raises (ToolConfigError,
a BadInput, so main_ppo prints it as one line before any worker starts).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

from logicrl.errors import BadInput

# The short kinds a failed call is counted under (ToolResult.error).
# limit: a sandbox limit stopped the code; sandbox: the local sandbox could not start it; service: an
# external sandbox failed; missing_kwargs: the row lacks the tools_kwargs the tool needs.
ERROR_KINDS = ("bad_json", "unknown_tool", "bad_arguments", "exception", "timeout", "killed", "limit",
               "sandbox", "service", "missing_kwargs")


class ToolConfigError(BadInput):
    """A tool YAML, a function-tool file or a tool class that cannot be used; one line."""


@dataclass(frozen=True)
class ToolCall:
    """One call as the model wrote it. `raw` holds the text between the tags when it did not parse
    as a JSON object with a string `name` (then `name` is "" and `arguments` empty)."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    raw: str | None = None


@dataclass(frozen=True)
class ToolResult:
    text: str  # what the model sees
    ok: bool
    error: str | None = None  # one of ERROR_KINDS when not ok
    latency_s: float = 0.0

    @classmethod
    def success(cls, text: str) -> ToolResult:
        return cls(text=text, ok=True)

    @classmethod
    def failure(cls, kind: str, text: str) -> ToolResult:
        # The model reads the kind too: "Error (timeout): ..." tells it what to change.
        return cls(text=f"Error ({kind}): {text}", ok=False, error=kind)


@runtime_checkable
class Tool(Protocol):
    """A tool: its name, its OpenAI function schema, and a call that never raises for the tool's own
    failures (the runner still catches whatever escapes). `kwargs` are the row's verl-style
    `extra_info.tools_kwargs[name]` create and execute kwargs, merged."""

    name: str
    schema: dict[str, Any]

    def call(self, arguments: dict[str, Any], **kwargs: Any) -> ToolResult: ...


def function_schema(name: str, description: str, properties: dict[str, Any], required: list[str]) -> dict:
    """An OpenAI function-tool schema: {"type": "function", "function": {name, description, parameters}}."""
    return {"type": "function", "function": {
        "name": name, "description": description,
        "parameters": {"type": "object", "properties": properties, "required": required}}}
