"""Override mistakes that only composing (Hydra) or the curriculum's record can find: each is one
`error:` line naming the override and the fix, exit 2, in seconds, before any model or Ray starts.

One override Hydra refuses runs the real entry point (its exception made one line there); the others
run its checks in-process (`check_main`), the same code without a launch. The curriculum's record is
read after the preflight, in `main_ppo.checked` (before Ray or torch is imported), so its refusal is
checked in-process too; its exit code and one line come from the same `fail` as a validation error's."""

from __future__ import annotations

import pytest

from logicrl.config.phases import ARR
from tests.bad_inputs.conftest import refused, timed_main
from tests.conftest import assert_refused, check_main, need_data

CURRICULUM = "+recipe=tiny_curriculum"


@pytest.mark.parametrize("overrides, says", [
    # `+` adds a key; the config already has this one.
    (["+data.train_batch_size=4"], "+data.train_batch_size=4: data.train_batch_size is already set"),
    # An index past a list's end: trainer.logger is [console] (conf/trainer), item 0 only.
    (["trainer.logger.7=console"], "trainer.logger.7=console: trainer.logger has no item 7"),
    # A stage that the curriculum does not have (stages count from 0: tiny_curriculum has 0 and 1).
    ([CURRICULUM, "+curriculum.stages.2.overrides.data.train_batch_size=4"],
     "curriculum.stages.2.overrides.data.train_batch_size=4: curriculum.stages has no item 2"),
    (["~data.no_such_key"], "~data.no_such_key: there is no data.no_such_key in the config to delete"),
    (["data=no_such_option"], "data=no_such_option: there is no such config (available for data: default)"),
])
def test_an_override_hydra_refuses_is_one_line(tmp_path, overrides, says):
    result = check_main(*overrides, "trainer.dry_run=true", f"hydra.run.dir={tmp_path / 'run'}")
    assert_refused(result, says)
    assert not (tmp_path / "run").exists()  # refused before Hydra made the run's directory


@pytest.mark.integration
def test_an_override_hydra_refuses_through_the_entry_point(tmp_path):
    result, seconds = timed_main("+data.train_batch_size=4", "trainer.dry_run=true",
                                 f"hydra.run.dir={tmp_path / 'run'}")
    refused(result, seconds, "+data.train_batch_size=4: data.train_batch_size is already set", bound=15)
    assert not (tmp_path / "run").exists()


def test_a_finished_stage_edited_before_a_rerun_is_refused_naming_the_change(tmp_path):
    """The record of a curriculum whose stage 1 finished (written as run_curriculum writes it), then
    the same command with stage 1's rollout.n changed: refused before any model or Ray starts."""
    from logicrl.config import compose
    from logicrl.config.stages import build_stages
    from logicrl.trainer.curriculum import RECORD_FILE, finished_row, write_record

    need_data("kk_role_5ppl")
    ckpt = tmp_path / "ckpt"
    args = [CURRICULUM, f"{ARR}.rollout.name=hf", f"trainer.default_local_dir={ckpt}"]
    stages = build_stages(compose(args), args)
    final = ckpt / stages[0].dir_name / f"global_step_{stages[0].plan.total_steps}"
    write_record(ckpt, stages, {stages[0].name: finished_row(stages[0], [], 1.0, final)})
    before = (ckpt / RECORD_FILE).read_text()
    result = check_main(*args, "+curriculum.stages.0.overrides.actor_rollout_ref.rollout.n=4",
                        f"hydra.run.dir={tmp_path / 'run'}")
    line = assert_refused(result, "curriculum stage 1/2 (3ppl) already finished with other settings than it has "
                          "now: actor_rollout_ref.rollout.n 8 -> 4;",
                          f"move this one aside first: mv {ckpt} {ckpt}.old")
    assert (ckpt / RECORD_FILE).read_text() == before and not list(ckpt.rglob("global_step_*"))  # nothing trained
    assert "+curriculum.stages.<index>.overrides.<key>=<value>" in line
