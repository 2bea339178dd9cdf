"""Samples -> metrics per data_source (logicrl/eval/report.py), on a fixture whose numbers are derived by hand
in the comments; answers for votes (logicrl/eval/answers.py)."""

import json
from pathlib import Path

import pytest

from logicrl.eval.answers import extract
from logicrl.eval.report import flat_metrics, group_metrics, read_samples, table, write_report

FIXTURE = Path(__file__).parent / "fixtures" / "samples.jsonl"


def values(metrics: dict) -> dict:
    return {name: v["value"] for name, v in metrics.items()}


def test_fixture_metrics_by_hand():
    (samples,) = read_samples(FIXTURE).values()
    metrics = group_metrics(samples, [1, 2, 3])
    assert list(metrics) == ["gsm8k", "kk_logic", "kk_logic/3ppl"]
    # gsm8k: problem 0 has 2 of 3 right (72, 71, 72), problem 1 none (5, 6, nothing)
    assert values(metrics["gsm8k"]) == pytest.approx({
        "mean@3": (2 / 3 + 0) / 2,
        "pass@1": (2 / 3 + 0) / 2,
        "pass@2": (1 + 0) / 2,         # 1 - C(1,2)/C(3,2) = 1
        "pass@3": (1 + 0) / 2,
        "maj@1": (2 / 3 + 0) / 2,
        "maj@2": (2 / 3 + 0) / 2,      # subsets {0,1} right (tie, 72 first), {0,2} right, {1,2} wrong (71 first)
        "maj@3": (1 + 0) / 2,          # 72 twice; problem 1: 5-6 tie, 5 first, wrong
        "completed": (2 / 3 + 1 / 3) / 2,
        "completed_correct": (1 / 3 + 0) / 2,  # only problem 0's first sample ended and is right
    })
    # one problem: 1 of 3 right ("a", "b", "b")
    assert values(metrics["kk_logic"]) == pytest.approx({
        "mean@3": 1 / 3, "pass@1": 1 / 3, "pass@2": 1 - 1 / 3, "pass@3": 1.0,
        "maj@1": 1 / 3, "maj@2": 2 / 3, "maj@3": 0.0, "completed": 1.0, "completed_correct": 1 / 3})
    assert metrics["kk_logic/3ppl"] == metrics["kk_logic"]
    # one problem: the bootstrap has nothing to resample; two: pass@2's values 1 and 0 give [0, 1]
    assert metrics["kk_logic"]["pass@2"]["low"] == metrics["kk_logic"]["pass@2"]["high"] == pytest.approx(2 / 3)
    assert (metrics["gsm8k"]["pass@2"]["low"], metrics["gsm8k"]["pass@2"]["high"]) == (0.0, 1.0)
    low, high = metrics["gsm8k"]["mean@3"]["low"], metrics["gsm8k"]["mean@3"]["high"]
    assert 0 < low < 1 / 3 < high < 1


def test_ks_past_n_are_left_out_and_flat_keys():
    (samples,) = read_samples(FIXTURE).values()
    metrics = group_metrics(samples, [1, 8])
    assert "pass@8" not in metrics["gsm8k"] and "pass@1" in metrics["gsm8k"]
    flat = flat_metrics(metrics)
    assert flat["val/gsm8k/pass@1"] == pytest.approx(1 / 3)
    assert flat["val/kk_logic/3ppl/maj@1/low"] == flat["val/kk_logic/3ppl/maj@1/high"] == pytest.approx(1 / 3)


def test_report_files_and_table(tmp_path):
    (samples,) = read_samples(FIXTURE).values()
    results = {"step0": group_metrics(samples, [1, 3]), "last": group_metrics(samples, [1, 3])}
    text, md, png = write_report(results, tmp_path)
    assert json.loads((tmp_path / "eval.json").read_text()) == results
    assert png.is_file() and md.read_text().endswith(text + "\n")
    lines = text.splitlines()
    assert lines[0] == ("| checkpoint | data_source | mean@3 | pass@1 | pass@3 | maj@1 | maj@3 | completed "
                        "| completed_correct |")
    assert len(lines) == 2 + 2 * 3  # header, rule, 2 checkpoints x 3 groups
    assert lines[2].startswith("| step0 | gsm8k | 0.333 [")
    assert table({"x": {"chat": {"completed": {"value": 1.0, "low": 0.5, "high": 1.0}}}}).splitlines()[2] == \
        "| x | chat | 1.000 [0.500, 1.000] |"


@pytest.mark.parametrize(("source", "response", "truth", "answer"), [
    ("gsm8k", "so #### 0.5", "1/2", "1/2"),
    ("math", "\\boxed{\\frac{2}{4}}", "1/2", "1/2"),
    ("math", "\\boxed{x + 1}", "x+1", "x+1"),
    ("math", "no box", "1", None),
    ("kk_role", " Knight, because", {"role": "knight"}, "knight"),
    ("kk_logic", "</think><answer>Bob is a knave, Ann is a knight</answer>",
     {"solution_text_format": "(1) Ann is a knight\n(2) Bob is a knave", "think_opened": True},
     "ann=knight, bob=knave"),
    ("kk_logic", "<answer>Bob is a knave, Ann is a knight</answer>",  # malformed: the reward reads no answer
     {"solution_text_format": "(1) Ann is a knight\n(2) Bob is a knave", "think_opened": True}, None),
    ("my_source", "  free text ", None, "free text"),
])
def test_answers_for_votes(source, response, truth, answer):
    assert extract(source, response, truth) == answer
