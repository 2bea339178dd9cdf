"""The `code_interpreter` tool: runs the model's Python in the local sandbox (sandbox.py), or, with
`sandbox_fusion_url` set (verl's key), in an external SandboxFusion-style service instead.

Config keys (a tool YAML's `config:`), verl's names where verl has one:
  sandbox_fusion_url   null: the local sandbox; else the service's run_code URL
  num_workers          how many runs at once, per tool and process (the pool bound)        [4]
  default_timeout      wall-clock seconds per run, then the whole process group is killed  [10]
  memory_limit_mb      address-space limit of the code's process                          [1024]
  cpu_time_s           CPU seconds (null: the timeout)  max_file_mb [16]  max_open_files [64]
  max_processes        processes (and, under a pids cgroup, threads) at once               [64]
  max_output_chars     stdout+stderr as the model sees them, cut in the middle             [4096]
  isolate_network / read_only_fs / site_packages                                [true / true / true]
  extract_code_block   run only the first ```python block of `code`, when it has one       [false]
  print_last_expression  print the value of a final bare expression, as a REPL does        [false]
verl's `rate_limit`, `enable_global_rate_limit` and `type` are accepted and have no effect here.
RetoolCodeInterpreter (verl-recipe's retool CustomSandboxFusionTool) turns the last two on.
"""

from __future__ import annotations

import ast
import re
import threading
from typing import Any

from logicrl.tools.base import ToolConfigError, ToolResult, function_schema
from logicrl.tools.sandbox import SandboxLimits, run_python
from logicrl.tools.sandbox_fusion import run_remote

_SIGNALS = {9: "killed", 24: "CPU time", 25: "file size"}  # SIGKILL, SIGXCPU, SIGXFSZ
_ACCEPTED_VERL_KEYS = {"rate_limit", "enable_global_rate_limit", "type"}
_KEYS = {"sandbox_fusion_url", "num_workers", "default_timeout", "memory_limit_mb", "cpu_time_s", "max_file_mb",
         "max_open_files", "max_processes", "max_output_chars", "isolate_network", "read_only_fs", "site_packages",
         "default_language", "extract_code_block", "print_last_expression"}
_CODE_BLOCK = re.compile(r"```python(.*?)```", re.DOTALL)


class CodeInterpreter:
    DEFAULTS: dict[str, Any] = {}

    def __init__(self, config: dict[str, Any] | None = None, tool_schema: dict[str, Any] | None = None):
        config = {**self.DEFAULTS, **(config or {})}
        unknown = sorted(set(config) - _KEYS - _ACCEPTED_VERL_KEYS)
        if unknown:
            raise ToolConfigError(f"code_interpreter config: unknown key(s) {unknown}; known: {sorted(_KEYS)}")
        if config.get("default_language", "python") != "python":
            raise ToolConfigError(f"code_interpreter config: default_language={config['default_language']!r}; "
                                  "only python runs here")
        try:
            self.limits = SandboxLimits(
                timeout_s=float(config.get("default_timeout", 10)), memory_mb=int(config.get("memory_limit_mb", 1024)),
                cpu_s=None if config.get("cpu_time_s") is None else int(config["cpu_time_s"]),
                file_mb=int(config.get("max_file_mb", 16)), open_files=int(config.get("max_open_files", 64)),
                processes=int(config.get("max_processes", 64)),
                output_chars=int(config.get("max_output_chars", 4096)),
                isolate_network=bool(config.get("isolate_network", True)),
                read_only_fs=bool(config.get("read_only_fs", True)),
                site_packages=bool(config.get("site_packages", True)))
            workers = int(config.get("num_workers", 4))
        except (TypeError, ValueError) as exc:
            raise ToolConfigError(f"code_interpreter config: a limit is not a number ({exc})") from None
        if workers < 1 or self.limits.timeout_s <= 0 or self.limits.memory_mb < 64 or self.limits.processes < 1:
            raise ToolConfigError("code_interpreter config: num_workers >= 1, default_timeout > 0, "
                                  "memory_limit_mb >= 64 and max_processes >= 1 are needed")
        self.url = config.get("sandbox_fusion_url") or None
        # The runner waits this (plus a grace) before abandoning a call: the sandbox ends it first.
        # A remote call may take the HTTP timeout (run timeout + 10 s) and one retry.
        self.timeout_s = self.limits.timeout_s if self.url is None else 2 * (self.limits.timeout_s + 10)
        self.extract_code_block = bool(config.get("extract_code_block", False))
        self.print_last_expression = bool(config.get("print_last_expression", False))
        self._pool = threading.BoundedSemaphore(workers)
        self.schema = tool_schema or function_schema(
            "code_interpreter", "Run a Python program and return what it prints (stdout, then stderr). "
            "Each call is a fresh process: nothing is kept between calls.",
            {"code": {"type": "string", "description": "The Python source to run; print() the results you need."}},
            ["code"])
        self.name = self.schema["function"]["name"]

    def call(self, arguments: dict[str, Any], **kwargs: Any) -> ToolResult:
        code = arguments.get("code")
        if not isinstance(code, str):
            return ToolResult.failure("bad_arguments", f"{self.name} needs `code`, a string")
        if self.extract_code_block and (block := _CODE_BLOCK.search(code)):
            code = block.group(1).strip()
        if self.print_last_expression:
            code = print_last_expression(code)
        with self._pool:
            return self._remote(code) if self.url else self._local(code)

    def _local(self, code: str) -> ToolResult:
        run = run_python(code, self.limits)
        output = _cut(_join(run.stdout, run.stderr), self.limits.output_chars, run.dropped)
        if not run.isolation and not run.timed_out:  # the launcher died before the code started
            return ToolResult.failure("sandbox", "the sandbox could not start the code: "
                                      + (run.stderr.strip().splitlines() or ["no message"])[-1])
        if run.limit_hit == "processes":
            return ToolResult.failure("limit", f"the code started more than {self.limits.processes} processes "
                                      "and was stopped" + _tail(output))
        if run.timed_out:
            return ToolResult.failure("timeout", f"the code ran past {self.limits.timeout_s:g} s and was stopped"
                                      + _tail(output))
        code_ = run.returncode or 0
        if code_ > 128 and code_ - 128 in _SIGNALS:
            what = _SIGNALS[code_ - 128]
            kind = "killed" if what == "killed" else "limit"
            text = f"the code was stopped ({what} limit)" if kind == "limit" else "the code was killed"
            return ToolResult.failure(kind, text + _tail(output))
        if code_ != 0:
            return _failed_run(output, self.limits.memory_mb)
        return ToolResult.success(output or "(no output; print() what you want to see)")

    def _remote(self, code: str) -> ToolResult:
        answer = run_remote(self.url, code, self.limits.timeout_s, self.limits.memory_mb)
        if answer.service_error:
            return ToolResult.failure("service", answer.service_error)
        output = _cut(_join(answer.stdout, answer.stderr), self.limits.output_chars)
        if answer.timed_out:
            return ToolResult.failure("timeout", f"the code ran past {self.limits.timeout_s:g} s and was stopped"
                                      + _tail(output))
        if answer.return_code not in (0, None):
            return _failed_run(output, self.limits.memory_mb)
        return ToolResult.success(output or "(no output; print() what you want to see)")


class RetoolCodeInterpreter(CodeInterpreter):
    """verl-recipe retool's CustomSandboxFusionTool: the code may come in a ```python block, and a
    final expression is printed."""

    DEFAULTS = {"extract_code_block": True, "print_last_expression": True}


def print_last_expression(code: str) -> str:
    """`code` with its last statement wrapped in print() when it is a bare expression other than a
    call to print. Decided on the syntax tree, not by line as retool does (which wraps `x = 1` into
    `print(x = 1)`); code that does not parse is returned as is, for Python to report."""
    try:
        body = ast.parse(code).body
    except SyntaxError:
        return code
    if not body or not isinstance(body[-1], ast.Expr):
        return code
    last = body[-1]
    if isinstance(last.value, ast.Call) and isinstance(last.value.func, ast.Name) and last.value.func.id == "print":
        return code
    lines = code.splitlines()
    segment = ast.get_source_segment(code, last)
    if not segment:
        return code
    # ast's column offsets count UTF-8 bytes
    before = lines[last.lineno - 1].encode()[: last.col_offset].decode()
    after = lines[last.end_lineno - 1].encode()[last.end_col_offset:].decode()
    return "\n".join([*lines[: last.lineno - 1], f"{before}print({segment}){after}", *lines[last.end_lineno:]])


def _failed_run(output: str, memory_mb: int) -> ToolResult:
    last = output.rstrip().rsplit("\n", 1)[-1]
    if last.startswith("MemoryError"):
        return ToolResult.failure("limit", f"the code ran out of memory (limit {memory_mb} MB)\n{output}")
    if "File too large" in last:
        return ToolResult.failure("limit", f"the code wrote a file past the size limit\n{output}")
    return ToolResult.failure("exception", output or "the code exited with an error and printed nothing")


def _join(stdout: str, stderr: str) -> str:
    return stdout + ("\n" if stdout and not stdout.endswith("\n") and stderr else "") + stderr


def _tail(output: str) -> str:
    return f"; its output until then:\n{output}" if output else ""


def _cut(text: str, limit: int, dropped: int = 0) -> str:
    """The middle of `text` cut to `limit` characters; `dropped` more were already cut from its middle."""
    if len(text) <= limit and not dropped:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... {len(text) - 2 * half + dropped} characters cut ...]\n{text[-half:]}"
