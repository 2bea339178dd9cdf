"""reward.combine: each mode as a pair of weights, per-data_source rules, hand-computed rewards."""

import pytest

from logicrl.reward.combine import CombineError, CombineRule, Weights

DEFAULT_WEIGHTS = {"model": 1.0, "rule": 1.0}


def test_modes_are_weight_pairs():
    assert CombineRule.from_config("model", DEFAULT_WEIGHTS, None).default == Weights(1.0, 0.0)
    assert CombineRule.from_config("rule", DEFAULT_WEIGHTS, {}).default == Weights(0.0, 1.0)
    assert CombineRule.from_config("weighted", {"model": 0.5, "rule": 2}, None).default == Weights(0.5, 2.0)


def test_rewards_by_hand():
    rule = CombineRule.from_config("weighted", {"model": 0.5, "rule": 2.0},
                                   {"kk_logic": "rule", "chat": "model", "gsm8k": {"model": 0.25}})
    # weighted: 0.5 x 0.8 + 2 x -1 = -1.6
    assert rule.combine(0.8, -1.0, "other") == pytest.approx(-1.6)
    # kk_logic by rule alone: the model's score is not needed, and not used if given
    assert rule.combine(None, 3.0, "kk_logic") == 3.0 and rule.combine(9.0, 3.0, "kk_logic") == 3.0
    assert not rule.needs_model("kk_logic") and rule.needs_rule("kk_logic")
    # chat by the model alone: no rule reward is asked for (chat data may have none)
    assert rule.combine(0.8, None, "chat") == 0.8 and not rule.needs_rule("chat")
    # gsm8k: its own model weight, the rule weight from `weights`: 0.25 x 4 + 2 x 1 = 3
    assert rule.combine(4.0, 1.0, "gsm8k") == pytest.approx(3.0)


def test_a_needed_score_that_is_missing_is_a_bug():
    rule = CombineRule.from_config("weighted", DEFAULT_WEIGHTS, None)
    with pytest.raises(ValueError, match="weighs the rule score by 1.0 but none was given"):
        rule.combine(1.0, None, "kk_logic")


@pytest.mark.parametrize("mode, weights, by_source, message", [
    ("weighed", DEFAULT_WEIGHTS, None, "reward.combine.mode=weighed is not one of: model, rule, weighted "
                                       "(did you mean weighted?)"),
    ("weighted", {"model": 0, "rule": 0}, None, "reward.combine.weights: model=0 and rule=0 give every response"),
    ("weighted", {"model": float("nan"), "rule": 1}, None, "reward.combine.weights.model=nan must be a finite number"),
    ("model", {"model": 1, "rule": 0.5}, None, "reward.combine.weights (model=1.0, rule=0.5) are read only by"),
    ("model", DEFAULT_WEIGHTS, {"kk": {"rul": 1}}, "reward.combine.by_data_source.kk.rul is not a weight: did you "
                                                   "mean reward.combine.by_data_source.kk.rule?"),
    ("model", DEFAULT_WEIGHTS, {"kk": "rules"}, "reward.combine.by_data_source.kk=rules is not one of"),
    ("model", DEFAULT_WEIGHTS, ["kk"], "reward.combine.by_data_source must map data_source names"),
])
def test_bad_rules_are_one_line_errors(mode, weights, by_source, message):
    with pytest.raises(CombineError) as err:
        CombineRule.from_config(mode, weights, by_source)
    assert message in str(err.value) and "\n" not in str(err.value), str(err.value)


def test_a_weight_mapping_per_source_reads_the_weights():
    # weights changed with mode=model are still read: by the mapping that leaves `rule` out.
    rule = CombineRule.from_config("model", {"model": 1.0, "rule": 0.5}, {"kk": {"model": 2.0}})
    assert rule.weights("kk") == Weights(2.0, 0.5) and rule.weights("x") == Weights(1.0, 0.0)
