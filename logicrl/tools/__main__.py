"""`python -m logicrl.tools call [CONFIG] NAME 'JSON'`: one tool call by hand, printing what the model
would see. CONFIG is a tool YAML or a .py file of function tools; without it, the built-in tools.
`python -m logicrl.tools list [CONFIG]` prints each tool's schema; `check` what the code sandbox's
isolation holds on this machine. Exit 0 when the call succeeded, 1 when the tool answered with an
error, 2 for a bad config or bad command line.
"""

from __future__ import annotations

import argparse
import json
import sys

from logicrl.tools.base import ToolCall, ToolConfigError
from logicrl.tools.loading import load_tools_from
from logicrl.tools.runner import ToolRunner


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m logicrl.tools", description=__doc__.split("\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    call = sub.add_parser("call", help="run one tool call and print what the model would see")
    call.add_argument("args", nargs="+", metavar="[CONFIG] NAME JSON")
    call.add_argument("--timeout", type=float, default=60.0, help="the runner's timeout per call, seconds")
    call.add_argument("--kwargs", default=None, metavar="JSON",
                      help='the row\'s tools_kwargs for this tool: {"create_kwargs": {...}, "execute_kwargs": {...}}')
    listing = sub.add_parser("list", help="print the tools' schemas")
    listing.add_argument("config", nargs="?")
    sub.add_parser("check", help="what the local sandbox's isolation holds on this machine")
    ns = parser.parse_args(argv)
    if ns.command == "check":
        return _check()
    try:
        if ns.command == "list":
            for tool in load_tools_from(ns.config).values():
                print(json.dumps(tool.schema, indent=2))
            return 0
        if len(ns.args) not in (2, 3):
            parser.error("call takes [CONFIG] NAME JSON")
        *config, name, raw = ns.args
        tools = load_tools_from(config[0] if config else None)
    except ToolConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    try:
        arguments = json.loads(raw)
        tool_call = ToolCall(name, arguments) if isinstance(arguments, dict) else ToolCall(name, {}, raw=raw)
    except ValueError:
        tool_call = ToolCall(name, {}, raw=raw)
    try:
        row_kwargs = json.loads(ns.kwargs) if ns.kwargs else {}
        assert isinstance(row_kwargs, dict)
    except (ValueError, AssertionError):
        print(f"error: --kwargs must be a JSON object like {{\"create_kwargs\": {{...}}}}, got {ns.kwargs}",
              file=sys.stderr)
        return 2
    result = ToolRunner(tools, max_parallel_calls=1, timeout_s=ns.timeout).run([tool_call], {name: row_kwargs})[0]
    print(result.text)
    status = "ok" if result.ok else f"error={result.error}"
    print(f"[{name}: {status}, {result.latency_s:.3f} s]", file=sys.stderr)
    return 0 if result.ok else 1


def _check() -> int:
    """Runs an empty program in the local sandbox and prints what its launcher could apply."""
    from logicrl.tools.sandbox import SandboxLimits, run_python

    run = run_python("pass", SandboxLimits(timeout_s=30))
    for key, value in run.isolation.items():
        print(f"{key}: {value}")
    if run.returncode != 0:
        print(f"the sandbox failed to run an empty program (exit {run.returncode}): {run.stderr.strip()[-300:]}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
