"""sweep_summary.png: each trained job's learning curves against step and wall time beside the memory bars
with the capacity marked, read back from the figure; a dry-run sweep keeps the memory bars alone. The same
from a real two-job sweep: tests/trainer/test_train_integration.py test_multirun_two_jobs."""

import json

from logicrl.launch.sweep_summary import job_rows, plot, table


def job(sweep, name, num, rows, **result):
    d = sweep / name
    d.mkdir(parents=True)
    (d / "result.json").write_text(json.dumps({"job": name, "num": num, "status": "done", "dry_run": not rows,
                                               "device": "cpu", "capacity_gb": 12.0, **result}))
    if rows:
        (d / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        (d / "curves.png").write_bytes(b"png")


def test_trained_jobs_draw_curves_by_step_and_wall_time_beside_the_memory(tmp_path):
    # Job a: steps of 2 s, validation before training (step 0) and at step 2; job b: steps of 3 s.
    job(tmp_path, "n=2", 0, [{"step": 0, "val/acc": 0.4},
                             {"step": 1, "critic/score/mean": 0.1, "reward/acc/mean": 0.5, "timing_s/step": 2.0,
                              "perf/memory/generate/tensor_peak_gb": 0.2},
                             {"step": 2, "critic/score/mean": 0.3, "reward/acc/mean": 0.75, "timing_s/step": 2.0,
                              "val/acc": 0.9, "perf/memory/generate/tensor_peak_gb": 0.25}])
    job(tmp_path, "n=4", 1, [{"step": 1, "critic/score/mean": -0.2, "reward/acc/mean": 0.25, "timing_s/step": 3.0},
                             {"step": 2, "critic/score/mean": 0.0, "reward/acc/mean": 0.5, "timing_s/step": 3.0}])
    rows = job_rows(tmp_path)
    drawn = plot(rows, tmp_path / "sweep_summary.png")
    assert (tmp_path / "sweep_summary.png").stat().st_size > 10_000
    assert drawn["reward vs step"] == {"n=2": [(1, 0.1), (2, 0.3)], "n=4": [(1, -0.2), (2, 0.0)]}
    # Wall time: the cumulative step time, each job on its own clock.
    assert drawn["reward vs wall time"] == {"n=2": [(2, 0.1), (4, 0.3)], "n=4": [(3, -0.2), (6, 0.0)]}
    assert drawn["accuracy (validation dashed) vs wall time"] == {
        "n=2": [(2, 0.5), (4, 0.75)], "n=2 (val)": [(0, 0.4), (4, 0.9)], "n=4": [(3, 0.25), (6, 0.5)]}
    assert drawn["accuracy (validation dashed) vs step"]["n=2 (val)"] == [(0, 0.4), (2, 0.9)]
    # The memory bars' panel, in MB (every bar under 1 GB): measured peaks of 0.25 GB would be invisible under
    # a 12 GB capacity line, which the title states instead.
    assert drawn["peak memory per phase, measured\ncapacity 12.0 GB (cpu) is off this scale"] == {}
    # The table links each job's curves.
    assert "[curves.png](n=2/curves.png)" in table(rows) and "[curves.png](n=4/curves.png)" in table(rows)


def test_a_dry_run_sweep_keeps_the_memory_picture(tmp_path):
    job(tmp_path, "n=8", 0, [], planned_peak_gb={"generate": 3.0, "update_actor": 5.0})
    job(tmp_path, "n=16", 1, [], planned_peak_gb={"generate": 4.0, "update_actor": 9.0})
    drawn = plot(job_rows(tmp_path), tmp_path / "sweep_summary.png")
    # Planned peaks of 3-9 GB under a 12 GB capacity: the capacity line is on the scale.
    (capacity,) = drawn["sweep: peak memory per phase, planned (dry run)"].values()
    assert {y for _, y in capacity} == {12.0}
    assert "curves.png" not in table(job_rows(tmp_path))


def test_the_summary_draws_the_curves_each_job_draws():
    from logicrl.launch.sweep_summary import CURVES
    from logicrl.trainer.curves import CURVES as DRAWN

    assert CURVES == DRAWN
