"""How a learned reward model's score and the rule reward make one sequence reward (reward.combine).

    rule = CombineRule.from_config(mode, weights, by_data_source)       # CombineError on a bad rule
    reward = rule.combine(model_score, rule_score, data_source)

Every mode is a pair of weights (model, rule): `model` is (1, 0), verl's behaviour (its reward
manager returns the reward model's scores and skips the rule function); `rule` is (0, 1); `weighted`
is reward.combine.weights. `by_data_source` gives some sources another mode or their own weights, so
one run can score K&K puzzles by rule and chat prompts by the model. A term weighted 0 is never
needed: `needs_rule(source)` tells the row check (config/rewards.py `reward_check`) that a data_source
with no rule reward can be scored by the model alone. Where a rule exists the reward phase scores it
even at weight 0, for the report (accuracy), never for the reward.
"""

from __future__ import annotations

import difflib
import math
from collections.abc import Mapping
from dataclasses import dataclass, field

MODES = ("model", "rule", "weighted")
TERMS = ("model", "rule")
KEY = "reward.combine"


class CombineError(ValueError):
    """A reward.combine rule that cannot be used; one line naming the key and the fix."""


@dataclass(frozen=True)
class Weights:
    model: float
    rule: float


FIXED = {"model": Weights(1.0, 0.0), "rule": Weights(0.0, 1.0)}


@dataclass(frozen=True)
class CombineRule:
    default: Weights
    by_source: Mapping[str, Weights] = field(default_factory=dict)

    @classmethod
    def from_config(cls, mode: str, weights: Mapping, by_data_source: Mapping | None) -> CombineRule:
        """The rule for reward.combine's `mode`, `weights` ({model, rule}) and `by_data_source`."""
        base = _weights(weights, Weights(1.0, 1.0), f"{KEY}.weights")
        by_data_source = by_data_source or {}
        if not isinstance(by_data_source, Mapping):
            raise CombineError(f"{KEY}.by_data_source must map data_source names to a mode or weights, "
                               f"got {by_data_source!r:.80}")
        reads_weights = mode == "weighted"
        by_source = {}
        for source, entry in by_data_source.items():
            where = f"{KEY}.by_data_source.{source}"
            if isinstance(entry, Mapping):
                by_source[str(source)] = _weights(entry, base, where)
                reads_weights = True
            else:
                by_source[str(source)] = _mode(entry, base, where)
                reads_weights |= entry == "weighted"
        if base != Weights(1.0, 1.0) and not reads_weights:
            raise CombineError(f"{KEY}.weights (model={base.model}, rule={base.rule}) are read only by "
                               f"{KEY}.mode=weighted or a by_data_source weight mapping, and {KEY}.mode={mode}: "
                               f"set {KEY}.mode=weighted or drop the weights")
        return cls(_mode(mode, base, f"{KEY}.mode"), by_source)

    def negative_weights(self) -> list[str]:
        """The negative weights in force, as `key=value` (config/validate.py warns about them)."""
        found = [f"{KEY}.weights.{name}={getattr(self.default, name):g}" for name in TERMS
                 if getattr(self.default, name) < 0]
        # A source's weight inherited from reward.combine.weights is said once, above.
        found += [f"{KEY}.by_data_source.{source}.{name}={getattr(w, name):g}" for source, w in self.by_source.items()
                  for name in TERMS if getattr(w, name) < 0 and getattr(w, name) != getattr(self.default, name)]
        return found

    def weights(self, data_source: str) -> Weights:
        return self.by_source.get(data_source, self.default)

    def needs_rule(self, data_source: str) -> bool:
        return self.weights(data_source).rule != 0

    def needs_model(self, data_source: str) -> bool:
        return self.weights(data_source).model != 0

    def combine(self, model_score: float | None, rule_score: float | None, data_source: str) -> float:
        """The sequence reward of one response; a score whose weight is 0 may be None."""
        w = self.weights(data_source)
        total = 0.0
        for weight, score, name in ((w.model, model_score, "reward model"), (w.rule, rule_score, "rule")):
            if weight == 0:
                continue
            if score is None:
                raise ValueError(f"data_source={data_source!r} weighs the {name} score by {weight} but none was given")
            total += weight * score
        return total


def _mode(mode, base: Weights, where: str) -> Weights:
    if mode not in MODES:
        close = difflib.get_close_matches(str(mode), MODES, n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise CombineError(f"{where}={mode} is not one of: {', '.join(MODES)}{hint}")
    return base if mode == "weighted" else FIXED[mode]


def _weights(entry: Mapping, base: Weights, where: str) -> Weights:
    for name in entry:
        if name not in TERMS:
            close = difflib.get_close_matches(str(name), TERMS, n=1)
            hint = f"did you mean {where}.{close[0]}?" if close else f"the weights are {' and '.join(TERMS)}"
            raise CombineError(f"{where}.{name} is not a weight: {hint}")
    values = {name: entry.get(name, getattr(base, name)) for name in TERMS}
    for name, value in values.items():
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise CombineError(f"{where}.{name}={value!r} must be a finite number")
    if values["model"] == 0 and values["rule"] == 0:
        raise CombineError(f"{where}: model=0 and rule=0 give every response the reward 0: make one of them non-zero")
    return Weights(float(values["model"]), float(values["rule"]))
