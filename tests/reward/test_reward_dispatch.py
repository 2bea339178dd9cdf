"""The data_source registry behind logicrl.reward.compute_score."""

import math

import pytest

import logicrl.reward as reward

KK_TRUTH = {"solution_text_format": "(1) Zoey is a knight\n(2) Oliver is a knave", "think_opened": True}


@pytest.fixture
def registry(monkeypatch):
    # Registrations made by a test must not leak into the others.
    monkeypatch.setattr(reward, "REWARD_FNS", dict(reward.REWARD_FNS))
    return reward.REWARD_FNS


def test_kk_logic_goes_to_the_kk_reward():
    response = "r</think><answer>Zoey is a knight, Oliver is a knave</answer>"
    assert reward.compute_score("kk_logic", response, KK_TRUTH) == {
        "score": 3.0,
        "format": 1.0,
        "answer": 2.0,
        "acc": 1.0,
        "format_ok": 1.0,
    }


@pytest.mark.parametrize("source", ["openai/gsm8k", "gsm8k", "math"])
def test_verl_math_names_go_to_the_math_reward(source):
    assert reward.compute_score(source, "#### 1,234", "1234", extra_info={"index": 0})["acc"] == 1.0


def test_unknown_data_source_names_it_and_the_known_ones():
    with pytest.raises(KeyError) as info:
        reward.compute_score("zebra_logic", "x", {})
    message = str(info.value)
    assert "'zebra_logic'" in message and "'kk_logic'" in message and "'openai/gsm8k'" in message


def test_registered_float_reward_is_normalised_and_called_with_verl_keywords(registry):
    calls = []

    @reward.register("length")
    def length_reward(data_source, solution_str, ground_truth, extra_info=None):
        calls.append((data_source, solution_str, ground_truth, extra_info))
        return len(solution_str)

    assert reward.compute_score("length", "abcd", None, extra_info={"i": 1}) == {"score": 4.0}
    assert calls == [("length", "abcd", None, {"i": 1})]


def test_registering_a_taken_name_raises(registry):
    with pytest.raises(ValueError, match="'kk_logic' already has a reward"):
        reward.register("kk_logic")(lambda **kwargs: 0.0)


@pytest.mark.parametrize(
    "result, error",
    [
        ({"acc": 1.0}, ValueError),  # a dict without "score"
        ("1.0", TypeError),  # text is not a score even when it reads as one
        (None, TypeError),
        (math.nan, ValueError),  # NaN would poison every advantage in the batch
        ({"score": math.inf}, ValueError),
    ],
)
def test_bad_results_raise_naming_the_source(registry, result, error):
    reward.register("broken")(lambda **kwargs: result)
    with pytest.raises(error, match="data_source='broken'"):
        reward.compute_score("broken", "x", None)


def test_dict_result_keeps_components_and_floats_the_score():
    assert reward.normalize_score({"score": 1, "acc": 1}, "r") == {"score": 1.0, "acc": 1}


@pytest.mark.parametrize("source, truth", [
    ("kk_logic", {"solution_text_format": "(1) Zoey is a knight\n(2) Oliver is a knave", "think_opened": True}),
    ("kk_role", {"name": "Zoey", "role": "knave"}),
    ("gsm8k", "72"),
    ("math", 0.5),
])
def test_ground_truths_the_rewards_can_read_pass(source, truth):
    from logicrl.reward import ground_truth_problem

    assert ground_truth_problem(source, truth) is None


@pytest.mark.parametrize("source, truth, says", [
    ("kk_logic", "(1) Zoey is a knight", "K&K ground truth must be a mapping with 'solution_text_format'"),
    ("kk_logic", {"solution_text_format": "Zoey is honest"}, "does not read '(k) <Name> is a knight|knave'"),
    ("kk_role", {"name": "Zoey"}, "kk_role ground truth must be {'role': one of ['knight', 'knave']"),
    ("kk_role", "knight", "kk_role ground truth must be"),
    ("math", {"answer": 72}, "math ground truth must be the final answer"),
    ("gsm8k", "  ", "math ground truth must be the final answer"),
])
def test_ground_truths_a_reward_cannot_read_name_the_reward_and_why(source, truth, says):
    from logicrl.reward import ground_truth_problem

    problem = ground_truth_problem(source, truth)
    assert problem.startswith(f"reward_model.ground_truth {truth!r:.80} does not fit the {source!r} reward (")
    assert says in problem


def test_a_data_source_without_a_reward_is_a_problem_naming_it():
    from logicrl.reward import ground_truth_problem

    assert ground_truth_problem("knk", {}).startswith("no reward for data_source='knk'; known: [")
