"""The closing memory table (memory/report.py): planned beside measured, each column named for what it is."""

import json

from logicrl.memory.report import RunShape, measured_peaks, memory_report, report_table, run_shape


def test_peaks_are_the_largest_over_steps_and_keep_their_names():
    rows = [{"step": 0, "val/acc": 0.5},  # a validation-only row: nothing measured
            {"perf/memory/generate/rss_peak_gb": 1.1, "perf/memory/generate/tensor_peak_gb": 0.12,
             "timing_s/generate": 1},
            {"perf/memory/generate/rss_peak_gb": 1.0},  # an untracked step: RSS only
            {"perf/memory/generate/rss_peak_gb": 1.05, "perf/memory/generate/tensor_peak_gb": 0.15,
             "perf/checkpoint/save/rss_peak_gb": 9.0}]  # not a phase of the plan
    assert measured_peaks(rows) == {"generate": {"rss_peak_gb": 1.1, "tensor_peak_gb": 0.15}}


def test_cpu_table_sets_tensors_beside_the_plan_and_rss_apart():
    table = report_table({"generate": 0.18, "update_actor": 0.25},
                         {"generate": {"tensor_peak_gb": 0.15, "rss_peak_gb": 1.1},
                          "update_actor": {"rss_peak_gb": 1.2}})
    lines = table.splitlines()
    assert "process RSS is the whole process" in lines[0]
    assert lines[1].split() == ["phase", "planned", "tensor", "peak", "peak/plan", "process", "RSS"]
    assert lines[2].split() == ["generate", "0.180", "0.150", "0.83", "1.100"]  # 0.15 / 0.18
    assert lines[3].split() == ["update_actor", "0.250", "-", "-", "1.200"]  # never tracked: said, not zero


def test_cuda_table_uses_the_drivers_figure_and_lists_an_unplanned_phase_last():
    table = report_table({"generate": 8.0}, {"generate": {"tensor_peak_gb": 7.5, "peak_gb": 7.5, "device_used_gb": 9.0},
                                             "update_weights": {"tensor_peak_gb": 2.0, "device_used_gb": 3.0}})
    lines = table.splitlines()
    assert "device used is the whole device" in lines[0]
    assert lines[2].split() == ["generate", "8.000", "7.500", "0.94", "9.000"]
    assert lines[3].split() == ["update_weights", "-", "2.000", "-", "3.000"]


def test_a_run_without_steps_has_no_table(tmp_path):
    (tmp_path / "metrics.jsonl").write_text('{"step": 0, "val/acc": 0.5}\n')
    assert memory_report({"generate": 0.1}, tmp_path) is None


def test_the_peak_is_set_against_the_plan_for_what_the_measured_steps_ran(tmp_path):
    rows = [{"step": 0, "val/acc": 0.5},
            # step 1: tracked, prompts up to 40 tokens, micro-batches of 8 (an OOM retry halved the configured 16)
            {"step": 1, "prompt_length/max": 40.0, "response_length/max": 4.0, "perf/micro_size/update_actor": 8.0,
             "perf/memory/update_actor/tensor_peak_gb": 0.09, "perf/memory/update_actor/rss_peak_gb": 1.0},
            # step 2: untracked (RSS only): its longer prompts say nothing about the tensor peak
            {"step": 2, "prompt_length/max": 100.0, "response_length/max": 4.0, "perf/micro_size/update_actor": 16.0,
             "perf/memory/update_actor/rss_peak_gb": 1.0},
            # step 10: tracked, a longer response
            {"step": 10, "prompt_length/max": 38.0, "response_length/max": 6.0, "perf/micro_size/update_actor": 8.0,
             "perf/memory/update_actor/tensor_peak_gb": 0.1}]
    assert run_shape(rows) == RunShape(40, 6, {"update_actor": 8}, (1, 10))
    assert run_shape(rows[:1]) is None
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    asked = []

    def plan_at(shape):
        asked.append(shape)
        return {"update_actor": 0.08}

    lines = memory_report({"update_actor": 0.17}, tmp_path, plan_at).splitlines()
    assert asked == [RunShape(40, 6, {"update_actor": 8}, (1, 10))]
    assert "(40 + 6 tokens)" in lines[1]
    assert lines[2].split() == ["phase", "planned", "at", "run's", "lengths", "tensor", "peak", "peak/plan",
                                "process", "RSS"]
    assert lines[3].split() == ["update_actor", "0.170", "0.080", "0.100", "1.25", "1.000"]  # 0.1 / 0.08
    # A run that measured step 1 alone says why a phase before its first update reads under the plan.
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows[:3]))
    lines = memory_report({"update_actor": 0.17}, tmp_path, plan_at).splitlines()
    assert lines[2].startswith("step 1 alone was measured") and lines[3].split()[0] == "phase"


def test_the_plan_for_what_a_run_ran(data):
    """preflight's peaks_gb_at on make train's model (vLLM, CPU): the same plan at a run's lengths and micro-
    batches; at step 1 alone, no optimizer state before the first update."""
    from dataclasses import replace

    from logicrl.config.phases import ARR
    from logicrl.memory.phases import GB
    from logicrl.memory.planner import plan_inputs
    from logicrl.preflight.memory import peaks_gb_at
    from tests.memory.conftest import planned

    *_, x = planned(*data, f"{ARR}.rollout.name=vllm", f"{ARR}.actor.ppo_micro_batch_size_per_gpu=16", device="cpu")
    memory = plan_inputs(x, 16 * GB)

    def gb(plan, phase):
        return round(plan.phase(phase).total / GB, 3)

    later = peaks_gb_at(RunShape(44, 4, {"update_actor": 8}, (1, 10)), memory)
    ran = plan_inputs(replace(x, prompt_len=44).with_micro({f"{ARR}.actor.ppo_micro_batch_size_per_gpu": 8}), 16 * GB)
    assert later == {p: gb(ran, p) for p in ("generate", "update_actor", "update_weights")}
    assert later["update_actor"] < gb(memory, "update_actor")  # shorter rows, half the micro-batch
    first = peaks_gb_at(RunShape(44, 4, {"update_actor": 8}, (1,)), memory)
    states = 2 * 4 * 467_456  # AdamW's two fp32 moments of the tiny actor's 467,456 parameters
    assert first["generate"] == round((ran.phase("generate").total - states) / GB, 3)
    assert first["update_actor"] == later["update_actor"] and first["update_weights"] == later["update_weights"]
