"""K&K reward: one hand-written case per branch, then properties over arbitrary text.

Expected scores are format + answer from the table in logicrl/reward/kk.py:
3 = +1 +2 (right), -0.5 = +1 -1.5 (wrong), -1 = +1 -2 (unparseable), -3 = -1 -2 (malformed).
"""

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from logicrl.reward import kk

SOLUTION = "(1) Zoey is a knight\n(2) Oliver is a knave\n(3) Emma is a knight"
TRUTH_OPENED = {"solution_text_format": SOLUTION, "statements": json.dumps([]), "think_opened": True}
TRUTH_CLOSED = {**TRUTH_OPENED, "think_opened": False}
RIGHT = "(1) Zoey is a knight\n(2) Oliver is a knave\n(3) Emma is a knight"


def score(response, truth=TRUTH_OPENED):
    return kk.compute_score("kk_logic", response, truth)


def test_correct_answer_scores_three_with_components():
    # think_opened: the prompt wrote "<think>", the response starts inside it.
    assert score(f"Zoey says ... so\n</think>\n<answer>{RIGHT}</answer>") == {
        "score": 3.0,
        "format": 1.0,
        "answer": 2.0,
        "acc": 1.0,
        "format_ok": 1.0,
    }


def test_correct_answer_when_the_response_opens_think_itself():
    assert score(f"<think>reasoning</think><answer>{RIGHT}</answer>", TRUTH_CLOSED)["score"] == 3.0


def test_own_think_tag_after_an_opened_one_fails_format():
    # Logic-RL's outcome with the default templates: the prompt's <think> plus this one make two.
    result = score(f"<think>reasoning</think><answer>{RIGHT}</answer>")
    assert (result["score"], result["format"], result["answer"], result["format_ok"]) == (-3.0, -1.0, -2.0, 0.0)


def test_missing_think_open_when_prompt_did_not_open_it_fails_format():
    assert score(f"reasoning</think><answer>{RIGHT}</answer>", TRUTH_CLOSED)["score"] == -3.0


@pytest.mark.parametrize(
    "response",
    [
        f"a</think></think><answer>{RIGHT}</answer>",  # duplicated </think>
        f"a</think><answer>{RIGHT}</answer><answer>{RIGHT}</answer>",  # duplicated answer block
        f"a</think><answer>{RIGHT}</answer></answer>",  # duplicated </answer>
        f"a</think><answer>{RIGHT}",  # </answer> missing
        f"a<answer>{RIGHT}</answer></think>",  # answer before </think>
        f"a</think></answer>{RIGHT}<answer>",  # answer tags swapped
        f"a</think>{RIGHT}",  # no answer tags at all
        "",
    ],
)
def test_format_failures_score_minus_three_even_with_a_right_answer_inside(response):
    result = score(response)
    assert result == {"score": -3.0, "format": -1.0, "answer": -2.0, "acc": 0.0, "format_ok": 0.0}


def test_text_after_answer_is_allowed():
    # Decision (Logic-RL's): only tag counts and order are checked, so a trailing remark or an
    # end-of-text token after </answer> does not cost the format reward.
    assert score(f"r</think><answer>{RIGHT}</answer>\nHope this helps!<|im_end|>")["score"] == 3.0


def test_names_in_another_case_are_still_correct():
    answer = "(1) ZOEY is a KNIGHT\n(2) oliver IS A knave\n(3) emma is a Knight"
    assert score(f"r</think><answer>{answer}</answer>")["score"] == 3.0


def test_different_person_order_is_still_correct():
    answer = "Emma is a knight, Oliver is a knave and Zoey is a knight."
    assert score(f"r</think><answer>{answer}</answer>")["acc"] == 1.0


def test_wrong_role_parses_but_scores_minus_half():
    answer = "(1) Zoey is a knight\n(2) Oliver is a knight\n(3) Emma is a knight"
    result = score(f"r</think><answer>{answer}</answer>")
    assert (result["score"], result["format"], result["answer"], result["acc"]) == (-0.5, 1.0, -1.5, 0.0)


@pytest.mark.parametrize(
    "answer",
    [
        "(1) Zoey is a knight\n(2) Oliver is a knave",  # a missing person: two roles for three people
        RIGHT + "\n(4) Liam is a knave",  # an extra person: four roles
        RIGHT + "\nKnights always tell the truth.",  # extra role words break the count
        "(1) Zoey is a knight\n(2) Oliver is a knave\n(3) Emma: knight",  # right count, Emma not matched
        "(1) Zoey is a knight\n(2) Oliver is a knave\n(3) Liam is a knight",  # a stranger instead of Emma
        "Zoey, Emma: knights. Oliver: knave.",  # no "<Name> is a ..." at all
        "",
    ],
)
def test_unparseable_answers_score_minus_one(answer):
    result = score(f"r</think><answer>{answer}</answer>")
    assert (result["score"], result["format"], result["answer"], result["acc"]) == (-1.0, 1.0, -2.0, 0.0)


def test_name_inside_a_longer_word_does_not_count_as_that_person():
    truth = {"solution_text_format": "(1) Ann is a knight\n(2) Bob is a knave", "think_opened": True}
    # "Joann is a knight" must not be read as Ann's role (word boundaries, as in Logic-RL).
    assert score("r</think><answer>Joann is a knight, Bob is a knave</answer>", truth)["score"] == -1.0


def test_missing_think_opened_means_the_prompt_opened_nothing():
    truth = {"solution_text_format": SOLUTION}
    assert score(f"<think>r</think><answer>{RIGHT}</answer>", truth)["score"] == 3.0


def test_non_string_response_scores_as_malformed():
    assert score(None)["score"] == -3.0


def test_huge_response_scores_without_trouble():
    padding = "Zoey is a knight? <think " * 200_000
    assert score(f"{padding}</think><answer>{RIGHT}</answer>")["score"] == 3.0


def test_ground_truth_parses_builder_format():
    assert kk.parse_solution_text(SOLUTION) == {"Zoey": "knight", "Oliver": "knave", "Emma": "knight"}


@pytest.mark.parametrize(
    "solution_text",
    ["", "(1) Zoey is a knight\n(2) zoey is a knave", "(1) Zoey is a knight\n(2) Oliver tells lies", 42],
)
def test_malformed_ground_truth_raises(solution_text):
    # A data bug, not model output: failing loudly beats scoring -2 for the whole run.
    with pytest.raises(ValueError, match="K&K ground truth"):
        score("r</think><answer>x</answer>", {"solution_text_format": solution_text, "think_opened": True})


# --- properties ---------------------------------------------------------------------------

# Reachable: format +1 with answer {2, -1.5, -2}; format -1 forces answer -2.
REACHABLE = {(1.0, 2.0), (1.0, -1.5), (1.0, -2.0), (-1.0, -2.0)}
SCORES = {3.0, -0.5, -1.0, -3.0}

FRAGMENTS = st.sampled_from(
    ["<think>", "</think>", "<answer>", "</answer>", "<answer", "</", ">", "Zoey", "oliver", "EMMA", "Liam",
     " is a ", "is", " a ", "knight", "knave", "knights", "KNAVE", "(1) ", "\n", " ", ".", ",", "é", "\u212a"]
)  # fmt: skip
FRAGMENT_TEXT = st.lists(FRAGMENTS, max_size=40).map("".join)


@st.composite
def answers(draw):
    """The truth's three people in any order and case with any roles, sometimes with one
    dropped, a stranger added or noise inserted: right, wrong and unparseable answers all
    come up often, which fragments alone almost never produce."""
    people = list(draw(st.permutations(["Zoey", "Oliver", "Emma"])))
    change = draw(st.sampled_from(["none", "none", "drop", "stranger", "noise"]))
    if change == "drop":
        people.pop()
    elif change == "stranger":
        people.append("Liam")
    clauses = [
        f"{draw(st.sampled_from([p, p.upper(), p.lower()]))} is a {draw(st.sampled_from(['knight', 'knave']))}"
        for p in people
    ]
    if change == "noise":
        clauses.insert(draw(st.integers(0, len(clauses))), draw(FRAGMENT_TEXT))
    return draw(st.sampled_from(["\n", ", "])).join(clauses)


def check_documented(result):
    assert set(result) == {"score", "format", "answer", "acc", "format_ok"}
    assert (result["format"], result["answer"]) in REACHABLE
    assert result["score"] == result["format"] + result["answer"] and result["score"] in SCORES
    assert result["acc"] == (1.0 if result["answer"] == 2.0 else 0.0)
    assert result["format_ok"] == (1.0 if result["format"] == 1.0 else 0.0)


@settings(max_examples=300)
@given(text=st.text(), think_opened=st.booleans())
def test_arbitrary_text_returns_documented_values(text, think_opened):
    check_documented(score(text, {**TRUTH_OPENED, "think_opened": think_opened}))


@settings(max_examples=500)
@given(text=FRAGMENT_TEXT, think_opened=st.booleans())
def test_tag_and_name_fragments_return_documented_values(text, think_opened):
    check_documented(score(text, {**TRUTH_OPENED, "think_opened": think_opened}))


@settings(max_examples=500)
@given(answer=answers(), tail=st.just("") | FRAGMENT_TEXT)
def test_well_formed_responses_return_documented_values(answer, tail):
    # A fixed well-formed skeleton, so the answer-parsing branches are reached; the tail may
    # add tags of its own and break the format again.
    check_documented(score(f"reasoning</think><answer>{answer}</answer>{tail}"))


@given(
    order=st.permutations(["Zoey is a knight", "Oliver is a knave", "Emma is a knight"]),
    upper=st.lists(st.booleans(), min_size=3, max_size=3),
    separator=st.sampled_from(["\n", ", ", "; ", " and "]),
)
def test_any_order_and_case_of_the_right_answer_scores_three(order, upper, separator):
    answer = separator.join(line.upper() if up else line for line, up in zip(order, upper))
    assert score(f"r</think><answer>{answer}</answer>")["score"] == 3.0


@given(flip=st.lists(st.booleans(), min_size=3, max_size=3).filter(any))
def test_any_wrong_assignment_scores_minus_half(flip):
    truth = kk.parse_solution_text(SOLUTION)
    other = {"knight": "knave", "knave": "knight"}
    lines = [f"{name} is a {other[role] if f else role}" for (name, role), f in zip(truth.items(), flip)]
    assert score("r</think><answer>" + "\n".join(lines) + "</answer>")["score"] == -0.5
