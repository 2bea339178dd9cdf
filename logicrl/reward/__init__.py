"""Rule rewards, chosen by each row's `data_source` from one registry.

`compute_score(data_source, solution_str, ground_truth, extra_info=None)` has verl's signature
(verl calls it with keywords, and so do we). Here it always returns a dict
`{"score": float, <components>...}`: the reward manager takes `score` as the sequence reward and
logs the other keys per sample (for K&K: format, answer, acc, format_ok). Functions in the
registry, and custom ones (logicrl.reward.custom), may return a float or such a dict; the
dispatcher turns a float x into {"score": x}, so callers see one shape.

Registered data sources:
    kk_logic                      logicrl.reward.kk    (Logic-RL's Knights-and-Knaves reward)
    openai/gsm8k, gsm8k           logicrl.reward.math  (numeric final answer after ####)
    math, lighteval/MATH, ...     logicrl.reward.symbolic  (final answer, symbolic equivalence: math-verify)
    kk_role                       logicrl.reward.role  (the embedded default's recall task)
    kk_role_tool                  logicrl.reward.role_tool  (the tool demo: the role a lookup tool returns)
"""

from __future__ import annotations

import math as _math
from collections.abc import Callable, Mapping
from typing import Any

from logicrl.reward import kk, role, role_tool, symbolic
from logicrl.reward import math as math_reward

# Takes (data_source, solution_str, ground_truth, extra_info) by keyword; returns a float or a
# dict with "score".
RewardFn = Callable[..., Any]

REWARD_FNS: dict[str, RewardFn] = {}


def register(*data_sources: str) -> Callable[[RewardFn], RewardFn]:
    """Decorator: score rows whose data_source is one of `data_sources` with this function."""

    def decorator(fn: RewardFn) -> RewardFn:
        for source in data_sources:
            # Silently replacing a reward would change what a run optimises; make it explicit.
            if source in REWARD_FNS and REWARD_FNS[source] is not fn:
                raise ValueError(
                    f"data_source {source!r} already has a reward ({REWARD_FNS[source].__qualname__}); "
                    f"pick another name or set reward.custom.path/name to replace rewards for a run"
                )
            REWARD_FNS[source] = fn
        return fn

    return decorator


def normalize_score(result: Any, source: str) -> dict[str, Any]:
    """A reward function's float or dict result as {"score": float, ...}.

    `source` names the function in error messages. A non-number or non-finite score raises:
    it is a bug in the reward function, and NaN rewards would silently poison the advantages.
    """
    if isinstance(result, Mapping):
        if "score" not in result:
            raise ValueError(f"{source} returned a dict without 'score' (keys: {sorted(map(str, result))})")
        return {**result, "score": _finite_float(result["score"], source)}
    return {"score": _finite_float(result, source)}


def _finite_float(value: Any, source: str) -> float:
    # float("1.5") would accept a string; a reward that returns text is a bug, not a score.
    if isinstance(value, (str, bytes)):
        raise TypeError(f"{source} returned score {value!r:.80}, a {type(value).__name__}; return a float")
    try:
        score = float(value)
    except (TypeError, ValueError):
        raise TypeError(f"{source} returned score {value!r:.80}, a {type(value).__name__}; return a float") from None
    if not _math.isfinite(score):
        raise ValueError(f"{source} returned a non-finite score {score}")
    return score


def compute_score(data_source: str, solution_str: str, ground_truth: Any, extra_info: Any = None) -> dict[str, Any]:
    """Score one response with the reward registered for its data_source."""
    fn = REWARD_FNS.get(data_source)
    if fn is None:
        raise KeyError(
            f"no reward for data_source={data_source!r}; known: {sorted(REWARD_FNS)}. "
            f"Register one with @logicrl.reward.register({data_source!r}) or set reward.custom.path/name"
        )
    result = fn(data_source=data_source, solution_str=solution_str, ground_truth=ground_truth, extra_info=extra_info)
    return normalize_score(result, f"reward for data_source={data_source!r}")


def ground_truth_problem(data_source: str, ground_truth: Any) -> str | None:
    """Why a row's data_source / ground_truth cannot be scored by the built-in rewards, or None.

    The rewards are total in the response (any text scores) and raise on a ground truth they
    cannot read, so scoring an empty response is the check: it asks each reward exactly what it
    needs, without a second description of its shape that could drift from the code.
    """
    if data_source not in REWARD_FNS:
        return (f"no reward for data_source={data_source!r}; known: {sorted(REWARD_FNS)}. Register one with "
                f"@logicrl.reward.register({data_source!r}) or set reward.custom.path/name")
    try:
        compute_score(data_source, "", ground_truth)
    except Exception as err:  # noqa: BLE001 - whatever the reward raises, it is this row's ground truth
        return (f"reward_model.ground_truth {ground_truth!r:.80} does not fit the {data_source!r} reward "
                f"({type(err).__name__}: {' '.join(str(err).split())[:160]})")
    return None


register("kk_logic")(kk.compute_score)
register("openai/gsm8k", "gsm8k")(math_reward.compute_score)
register(*symbolic.SYMBOLIC_SOURCES)(symbolic.compute_score)
register("kk_role")(role.compute_score)
register("kk_role_tool")(role_tool.compute_score)
