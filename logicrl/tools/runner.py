"""Runs a turn's tool calls: in parallel up to `max_parallel_calls`, each under `timeout_s`, every
failure turned into a ToolResult the model reads. `run` never raises for a tool's failure.

Each call gets its own daemon thread, gated by one semaphore shared by every `run` on this runner
(callers may run several rows' calls at once from several threads). A call past its timeout is
answered at once and its slot given back; its thread, if the tool ignores the timeout (a Python
function tool cannot be interrupted), is left to finish on its own. At most `max_hung` such threads
may exist: past that, new calls are refused with error "limit" instead of piling up threads, so a
tool that hangs for ever costs a bounded number of threads, never the run. Subprocess tools
(code_interpreter) kill their own process at their own timeout and so never hang a thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Mapping
from typing import Any

from logicrl.tools.base import Tool, ToolCall, ToolResult
from logicrl.tools.schema import argument_errors

_MAX_ERROR_CHARS = 500
_GRACE_S = 5.0  # a sandboxed run's start-up and clean-up past its own timeout


class _Slot:
    """One call's hand-off between its thread and the waiting caller."""

    def __init__(self, timeout_s: float) -> None:
        self.timeout_s = timeout_s
        self.lock = threading.Lock()
        self.started = threading.Event()
        self.done = threading.Event()
        self.started_at = 0.0
        self.result: ToolResult | None = None
        self.abandoned = False


class ToolRunner:
    def __init__(self, tools: Mapping[str, Tool], max_parallel_calls: int = 1, timeout_s: float = 30.0,
                 max_hung: int | None = None):
        if max_parallel_calls < 1:
            raise ValueError(f"max_parallel_calls={max_parallel_calls} must be >= 1")
        if not timeout_s > 0:
            raise ValueError(f"timeout_s={timeout_s} must be > 0")
        self.tools = dict(tools)
        self.max_parallel_calls = max_parallel_calls
        self.timeout_s = float(timeout_s)
        self.max_hung = 4 * max_parallel_calls if max_hung is None else max_hung
        self._slots = threading.Semaphore(max_parallel_calls)
        self._lock = threading.Lock()
        self._hung = 0

    def run(self, calls: list[ToolCall], tools_kwargs: Mapping[str, Any] | None = None) -> list[ToolResult]:
        """One result per call, in the calls' order."""
        results: list[ToolResult | None] = [None] * len(calls)
        pending: list[tuple[int, _Slot]] = []
        for i, call in enumerate(calls):
            problem = self._refusal(call)
            if problem is not None:
                results[i] = problem
                continue
            slot = _Slot(self._timeout_for(self.tools[call.name]))
            kwargs = _call_kwargs(tools_kwargs, call.name)
            threading.Thread(target=self._work, args=(self.tools[call.name], call, kwargs, slot),
                             name=f"tool-{call.name}", daemon=True).start()
            pending.append((i, slot))
        for i, slot in pending:
            results[i] = self._wait(slot)
        return results  # type: ignore[return-value]

    def _timeout_for(self, tool: Tool) -> float:
        """A tool that enforces its own timeout (`timeout_s`: code_interpreter's default_timeout) gets
        it plus a grace, so it reports its own timeout with the output so far instead of being abandoned."""
        own = getattr(tool, "timeout_s", None)
        return max(self.timeout_s, own + _GRACE_S) if isinstance(own, (int, float)) else self.timeout_s

    def _refusal(self, call: ToolCall) -> ToolResult | None:
        """The error for a call that must not run: unparsable, unknown tool, wrong arguments, too many hung."""
        if call.raw is not None and not call.name:
            return ToolResult.failure("bad_json", 'a tool call must be a JSON object {"name": ..., "arguments": '
                                      f'{{...}}}}, got: {_clip(call.raw, 200)}')
        if call.name not in self.tools:
            return ToolResult.failure("unknown_tool", f"no tool named {call.name!r}; tools: "
                                      f"{', '.join(sorted(self.tools)) or 'none'}")
        if call.raw is not None:
            return ToolResult.failure("bad_arguments", f"the arguments of {call.name} must be a JSON object")
        problem = argument_errors(self.tools[call.name].schema, call.arguments)
        if problem:
            return ToolResult.failure("bad_arguments", f"{call.name}: {problem}")
        with self._lock:
            if self._hung >= self.max_hung:
                return ToolResult.failure("limit", f"{self._hung} earlier tool calls are still running past "
                                          "their timeout; no new call is started until they end")
        return None

    def _work(self, tool: Tool, call: ToolCall, kwargs: dict[str, Any], slot: _Slot) -> None:
        self._slots.acquire()
        slot.started_at = time.monotonic()
        slot.started.set()
        try:
            result = tool.call(dict(call.arguments), **kwargs)
            if not isinstance(result, ToolResult):
                result = ToolResult.success("" if result is None else str(result))
        except Exception as exc:  # a tool's bug is the model's error message, never the run's
            result = ToolResult.failure("exception", _clip(f"{type(exc).__name__}: {exc}", _MAX_ERROR_CHARS))
        latency = time.monotonic() - slot.started_at
        with slot.lock:
            if slot.abandoned:  # answered as a timeout already; its slot was given back then
                with self._lock:
                    self._hung -= 1
                return
            slot.result = ToolResult(result.text, result.ok, result.error, latency)
            self._slots.release()
        slot.done.set()

    def _wait(self, slot: _Slot) -> ToolResult:
        slot.started.wait()  # queueing for a slot is not the call's time
        if slot.done.wait(max(0.0, slot.started_at + slot.timeout_s - time.monotonic())):
            return slot.result  # type: ignore[return-value]
        with slot.lock:
            if slot.result is not None:  # finished between the wait and the lock
                return slot.result
            slot.abandoned = True
            self._slots.release()
            with self._lock:
                self._hung += 1
        return ToolResult(f"Error (timeout): the tool did not answer within {slot.timeout_s:g} s", False,
                          "timeout", time.monotonic() - slot.started_at)


def _call_kwargs(tools_kwargs: Mapping[str, Any] | None, name: str) -> dict[str, Any]:
    """verl's per-row `extra_info.tools_kwargs[name]`: its create_kwargs and execute_kwargs, merged
    (execute's win); a stateless call has no separate create step."""
    entry = (tools_kwargs or {}).get(name) or {}
    return {**(entry.get("create_kwargs") or {}), **(entry.get("execute_kwargs") or {})}


def _clip(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 3] + "..."
