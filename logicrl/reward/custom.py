"""A user's reward function, loaded from `reward.custom.path` / `reward.custom.name`.

The function has verl's signature, `fn(data_source, solution_str, ground_truth, extra_info=None)`,
is called with keywords (as verl does), and returns a float or a dict with "score". It replaces
the built-in rewards for the whole run, as verl's `custom_reward_function` does.

`load_custom_reward` is meant to run during config validation, before any model or Ray work, so
that a wrong path or name is a config error (exit 2) rather than a crash at the first reward.
It only imports the user's file (no torch, no tokenizer here) and checks the function's
signature without calling it. Every failure is a `CustomRewardError` with a one-line message
naming the key, the file and the fix.

The module is kept in sys.modules under a name derived from its path (as verl keeps its
"custom_module"), so dataclasses and pickling by reference inside the user's file work, and two
custom files never shadow each other. Processes other than the one that loaded it (Ray workers)
should call `load_custom_reward(path, name)` themselves rather than receive the function.
"""

from __future__ import annotations

import functools
import hashlib
import importlib.util
import inspect
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from logicrl.reward import normalize_score

PATH_KEY = "reward.custom.path"
NAME_KEY = "reward.custom.name"
_SIGNATURE = "(data_source, solution_str, ground_truth, extra_info=None)"


class CustomRewardError(ValueError):
    """reward.custom.path / reward.custom.name do not lead to a usable reward function."""


def load_custom_reward(path: str | Path, name: str = "compute_score") -> Callable[..., Any]:
    """The function `name` defined in the Python file at `path`."""
    if not path:
        raise CustomRewardError(f"{PATH_KEY} is empty; set it to a Python file that defines {name}{_SIGNATURE}")
    file = Path(path).expanduser()
    if not file.is_file():
        what = "a directory" if file.is_dir() else "missing"
        raise CustomRewardError(
            f"{PATH_KEY}={str(path)!r} is {what} (resolved: {file.resolve()}); "
            f"set it to a Python file that defines {name}{_SIGNATURE}"
        )
    if not isinstance(name, str) or not name.isidentifier():
        raise CustomRewardError(
            f"{NAME_KEY}={name!r} is not a Python identifier; set it to the function's name in {file}"
        )

    module_name = "logicrl_custom_reward_" + hashlib.sha1(str(file.resolve()).encode()).hexdigest()[:12]
    spec = importlib.util.spec_from_file_location(module_name, file)
    if spec is None or spec.loader is None:
        raise CustomRewardError(f"{PATH_KEY}={str(path)!r} is not a Python source file; give it a .py file")
    module = importlib.util.module_from_spec(spec)
    sys.modules[module_name] = module
    try:
        spec.loader.exec_module(module)
    # SystemExit too: a file that runs argparse or sys.exit() at import time is a config error,
    # and must not end config validation with its own exit code.
    except (Exception, SystemExit) as error:
        sys.modules.pop(module_name, None)
        reason = " ".join(f"{type(error).__name__}: {error}".split())
        raise CustomRewardError(
            f"{PATH_KEY}={str(path)!r} failed to import ({reason:.300}); "
            f"fix the file (python {file} shows the traceback)"
        ) from error

    if not hasattr(module, name):
        defined = sorted(
            attr
            for attr, value in vars(module).items()
            if callable(value) and not attr.startswith("_") and getattr(value, "__module__", None) == module_name
        )
        raise CustomRewardError(
            f"{NAME_KEY}={name!r} is not defined in {PATH_KEY}={str(path)!r} (functions there: {defined}); "
            f"set {NAME_KEY} to one of them or define {name}{_SIGNATURE}"
        )
    fn = getattr(module, name)
    if not callable(fn):
        raise CustomRewardError(
            f"{NAME_KEY}={name!r} in {str(path)!r} is a {type(fn).__name__}, not a function; "
            f"point {NAME_KEY} at a function {_SIGNATURE}"
        )
    _check_signature(fn, name, path)
    return fn


def _check_signature(fn: Callable[..., Any], name: str, path: str | Path) -> None:
    # verl passes all four arguments by keyword; a function that cannot take them would only
    # fail at the first reward, after model loading and generation.
    try:
        signature = inspect.signature(fn)
    except (TypeError, ValueError):
        return  # some builtins and C callables have no signature to check; let them through
    try:
        signature.bind(data_source="", solution_str="", ground_truth=None, extra_info=None)
    except TypeError as error:
        raise CustomRewardError(
            f"{NAME_KEY}={name!r} in {str(path)!r} has signature {signature}, which cannot be called as "
            f"{name}{_SIGNATURE} by keyword ({error}); change its parameters"
        ) from None


def wrap_custom_reward(fn: Callable[..., Any], name: str | None = None) -> Callable[..., dict[str, Any]]:
    """`fn` as a reward with verl's signature whose float or dict result becomes {"score": float, ...}."""
    source = f"custom reward {name or getattr(fn, '__qualname__', repr(fn))}"

    @functools.wraps(fn)
    def compute_score(
        data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None
    ) -> dict[str, Any]:
        result = fn(data_source=data_source, solution_str=solution_str, ground_truth=ground_truth,
                    extra_info=extra_info)
        return normalize_score(result, source)

    return compute_score
