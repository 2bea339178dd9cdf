"""The end-of-run PNGs (trainer/curves.py, trainer/summaries.py) from a run or a curriculum stage
that had no validation: drawn without a word on stderr (matplotlib warns when asked for the legend
of an empty plot)."""

from __future__ import annotations

import json
import warnings
from types import SimpleNamespace

from logicrl.trainer.curves import curve_points, plot_curves
from logicrl.trainer.summaries import plot_stages


def test_curves_without_accuracy_draw_quietly(tmp_path, capfd):
    # No validation and a reward without an accuracy component: the accuracy panel is empty.
    rows = [{"step": s, "critic/score/mean": -1.0 + s / 2} for s in (1, 2)]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # any warning fails the test
        out = plot_curves(tmp_path)
    assert out.stat().st_size > 0
    assert curve_points(tmp_path)["validation accuracy"] == curve_points(tmp_path)["train accuracy"] == []
    assert curve_points(tmp_path)["tool calls per sample"] == []  # no tool panel for a single-turn run
    assert capfd.readouterr().err == ""


def test_curriculum_curves_without_validation_draw_quietly(tmp_path, capfd):
    stages = [SimpleNamespace(name="3ppl"), SimpleNamespace(name="5ppl")]
    done = {"3ppl": {"history": [{"step": 1, "reward": -0.5}, {"step": 2, "reward": 0.0}]}}  # no val_acc anywhere
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = plot_stages(stages, done, tmp_path / "curriculum_curves.png")
    assert out.stat().st_size > 0
    assert capfd.readouterr().err == ""


def test_phase_breakdown_per_step_draws_quietly(tmp_path, capfd):
    from logicrl.trainer.curves import phase_points, plot_phases

    # A validation-only row (step 0) has no step time and is left out; a phase missing from a step is 0 there.
    rows = [{"step": 0, "val/acc": 0.5},
            {"step": 1, "timing_s/step": 3.0, "timing_s/generate": 2.0, "timing_s/update_actor": 1.0},
            {"step": 2, "timing_s/step": 2.5, "timing_s/generate": 1.5, "timing_s/update_actor": 0.5,
             "timing_s/save": 0.5}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    assert phase_points(tmp_path) == {"generate": [(1, 2.0), (2, 1.5)], "save": [(1, 0.0), (2, 0.5)],
                                      "update_actor": [(1, 1.0), (2, 0.5)]}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert plot_phases(tmp_path).stat().st_size > 0
    assert capfd.readouterr().err == ""


def test_curriculum_curves_draw_each_validation_set_across_stages(tmp_path, capfd):
    stages = [SimpleNamespace(name="3ppl"), SimpleNamespace(name="5ppl")]
    done = {name: {"history": [{"step": s, "reward": 0.1 * s, "val_acc": 0.5, "val/kk_role/3ppl/acc": 0.6,
                                "val/kk_role/5ppl/acc": 0.4} for s in (1, 2)]} for name in ("3ppl", "5ppl")}
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = plot_stages(stages, done, tmp_path / "curriculum_curves.png")
    assert out.stat().st_size > 0 and capfd.readouterr().err == ""


def test_a_multi_turn_runs_curves_show_its_tool_calls(tmp_path, capfd):
    rows = [{"step": 1, "critic/score/mean": -0.9, "reward/acc/mean": 0.0, "tool/calls_per_sample": 0.1,
             "num_turns/mean": 1.1, "tool/failure_rate": 0.0},
            {"step": 2, "critic/score/mean": 0.5, "reward/acc/mean": 0.7, "tool/calls_per_sample": 1.0,
             "num_turns/mean": 2.0, "tool/failure_rate": 0.0}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        out = plot_curves(tmp_path)
    points = curve_points(tmp_path)
    assert points["tool calls per sample"] == [(1, 0.1), (2, 1.0)]
    assert points["assistant turns (mean)"] == [(1, 1.1), (2, 2.0)]
    # Three panels (reward, accuracy, tool calls) make a wider picture than a single-turn run's two.
    import matplotlib.image

    assert matplotlib.image.imread(out).shape[1] == 1650
    assert capfd.readouterr().err == ""
