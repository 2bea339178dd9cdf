"""preflight(stages): each stage planned once, and what it returns is that plan (table, step plan, peaks)."""

from __future__ import annotations

from logicrl.config import compose, validate
from logicrl.config.phases import ARR
from logicrl.config.stages import Stage
from logicrl.preflight import Plans, preflight
from logicrl.preflight import memory as memory_preflight


def stage(index: int, data_files: list[str], tmp_path, *overrides: str) -> Stage:
    cfg, spec, plan = validate(compose([*data_files, "trainer.dry_run=true", f"{ARR}.rollout.name=hf",
                                        f"trainer.default_local_dir={tmp_path / 'ckpt'}", *overrides]))
    return Stage(index, f"s{index}", cfg, spec, plan)


def test_each_stage_is_planned_once_and_its_plan_is_handed_on(data_files, tmp_path, monkeypatch):
    calls = []
    plan_for = memory_preflight.plan_for
    monkeypatch.setattr(memory_preflight, "plan_for", lambda *a, **k: calls.append(a) or plan_for(*a, **k))
    stages = [stage(0, data_files, tmp_path), stage(1, data_files, tmp_path, "trainer.auto_micro_batch=true",
                                                         f"{ARR}.model.use_remove_padding=false")]  # picks rows
    plans = preflight(stages)
    assert len(calls) == 2  # the table, the picked micro-batches, the disk estimate and the peaks share it
    assert [s.plan for s in stages] == [c[2] for c in calls]  # the stages are not changed: the plans are returned
    fixed, auto = plans.stages
    assert "auto_micro_batch:" not in fixed.table
    assert fixed.plan.micro("update_actor") == stages[0].plan.micro("update_actor")
    assert fixed.plan.actor.grad_accumulation == "unsharded" != stages[0].plan.actor.grad_accumulation  # resolved
    line = next(line for line in auto.table.splitlines() if line.startswith("auto_micro_batch: "))
    picked = dict(word.split("=") for word in line.split()[1:] if "=" in word)  # as printed
    assert auto.plan.micro("update_actor").value == int(picked[f"{ARR}.actor.ppo_micro_batch_size_per_gpu"])
    assert not (tmp_path / "ckpt").exists()  # a dry run makes no directory


def test_the_peaks_are_each_phases_largest_over_the_stages(data_files, tmp_path):
    small = memory_preflight.check_memory(*validate(compose([*data_files, f"{ARR}.rollout.name=hf"])))
    large = memory_preflight.check_memory(*validate(compose([*data_files, f"{ARR}.rollout.name=hf",
                                                             "data.max_response_length=1024"])))
    assert large.peaks_gb["update_actor"] > small.peaks_gb["update_actor"]
    assert Plans((small, large)).peaks_gb == Plans((large, small)).peaks_gb == {
        phase: max(small.peaks_gb[phase], large.peaks_gb[phase]) for phase in small.peaks_gb}
