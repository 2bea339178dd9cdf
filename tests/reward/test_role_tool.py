"""The tool demo's reward (reward/role_tool.py) on the texts a trajectory decodes to: the first role word after
the tool's answer, which is found where a line starts with it."""

import pytest

from logicrl.reward.role_tool import compute_score

TRUTH = {"name": "Noah", "role": "knight"}
TOOL = "\ntool\nNoah is a knight.\nassistant\n"  # the tool turn as the embedded ChatML template decodes


@pytest.mark.parametrize("text, score", [
    (TOOL + "<think> Noah is a knight, so", 1.0),
    (TOOL + "<think> Noah is a knave, so", 0.0),
    # The model's verbatim copy of the tool's sentence is its answer, not the tool's.
    (TOOL + "<think> Noah is a knight.", 1.0),
    (TOOL + "<think> Noah is a knave. Noah is a knight.", 0.0),  # the first role word decides
    (TOOL + "<think> so who is a", -1.0),  # no role word
    ("<think> Noah is a knight, so", -1.0),  # the tool never answered (multi_turn.enable=false)
    # A sentence the model wrote before the tool turn is not the tool's answer.
    (" Noah is a knight." + TOOL + "<think> Noah is a knave", 0.0),
    (TOOL.replace("knight", "knave") + "<think> Noah is a knight", -1.0),  # another row's answer
])
def test_scores(text, score):
    result = compute_score("kk_role_tool", text, TRUTH)
    assert result["score"] == score and result["acc"] == float(score == 1.0)
    assert result["tool_answered"] == float("\nNoah is a knight." in text)


def test_a_bad_ground_truth_is_one_line():
    with pytest.raises(ValueError, match="kk_role_tool ground truth must be"):
        compute_score("kk_role_tool", "x", {"name": "Noah", "role": "wizard"})
