"""Damaged checkpoints and checkpoints that do not fit, on a real run's checkpoints.

The newest one changed in place (same size) is set aside with one warning, never deleted, and the
run resumes from the newest intact one, training as the first run did; one that does not fit the
run is refused by the preflight before anything starts; a disk that fills up mid-save ends the run
with one line, the previous checkpoint intact; one without a manifest is said to be unverified, and
with NaN in a shard it is refused once loaded, never trained on. One run of several launches, so the checkpoints are
written once. Every file kind's same-size damage, in-process: tests/trainer/test_checkpoint_integrity.py.
The misfits run main_ppo.py's checks in-process (`check_main`) on the real checkpoints: the
preflight's refusal path through the entry point is tests/bad_inputs/test_data.py's.
"""

from __future__ import annotations

import json
import logging
import re

import pytest

from logicrl.config.phases import ARR
from logicrl.run_lock import LOCK_FILE
from logicrl.trainer.checkpoint import MANIFEST_FILE, damage, find_resume_point, manifest
from tests.conftest import ROLE_DATA, TINY_RUN, assert_refused, check_main, read_metrics, run_main, tail

RUN = [*ROLE_DATA, *TINY_RUN, "trainer.save_freq=1"]


def metrics(run_dir) -> dict[int, dict]:
    return {row["step"]: row for row in read_metrics(run_dir)}


@pytest.mark.integration
def test_a_damaged_newest_checkpoint_is_set_aside_a_misfit_refused_and_a_full_disk_said(tmp_path, caplog):
    ckpt = tmp_path / "ckpt"
    first = run_main(*RUN, "trainer.total_training_steps=2", f"trainer.default_local_dir={ckpt}",
                     f"hydra.run.dir={tmp_path / 'run1'}")
    assert first.returncode == 0, tail(first)
    shard = next((ckpt / "global_step_2" / "actor").glob("*.distcp"))
    size = shard.stat().st_size
    data = bytearray(shard.read_bytes())
    middle = size // 2
    data[middle - 100_000:middle + 100_000] = bytes(200_000)  # 200 KB zeroed in the middle: the size is unchanged
    shard.write_bytes(bytes(data))
    assert shard.stat().st_size == size

    # Before anything starts: a run the checkpoint cannot load into is refused, and nothing on disk changes.
    for override, says in (("algorithm.adv_estimator=gae", "global_step_2 holds no critic (it was saved with "
                                                           "algorithm.adv_estimator=grpo)"),
                           (f"{ARR}.model.lora_rank=8", f"global_step_2 was saved with {ARR}.model.lora_rank=0, "
                                                        "this run has 8")):
        result = check_main(*RUN, "trainer.total_training_steps=3", f"trainer.default_local_dir={ckpt}",
                            f"hydra.run.dir={tmp_path / 'refused'}", override)
        assert_refused(result, f"trainer.default_local_dir={ckpt}: ", says, "give it a directory of its own "
                       f"(trainer.default_local_dir=<another directory>) or move this one aside first: mv {ckpt} "
                       f"{ckpt}.old")
    assert sorted(p.name for p in ckpt.iterdir() if p.name != LOCK_FILE) == ["global_step_1", "global_step_2",
                                                      "latest_checkpointed_iteration.txt"]

    # The resume reads the newest in full: the damage is found, the one before it is used, and the
    # steps run again as they first ran. The disk then fills up in step 4's save.
    second = run_main(*RUN, "trainer.total_training_steps=4", f"trainer.default_local_dir={ckpt}",
                      f"hydra.run.dir={tmp_path / 'run2'}", fault="enospc@save:4")
    out = second.stdout + second.stderr
    warnings = [line for line in out.splitlines() if "is damaged" in line]
    assert len(warnings) == 1 and (f"{ckpt / 'global_step_2'} is damaged (actor/{shard.name} changed since it was "
                                   "saved (CRC-32))") in warnings[0], tail(second)
    assert f"resumed from {ckpt / 'global_step_1'} at step 1" in out
    errors = [line for line in second.stderr.splitlines() if line.startswith("error: ")]
    assert second.returncode == 1 and len(errors) == 1 and second.stderr.rstrip().endswith(errors[0]), tail(second)
    assert "Traceback" not in second.stderr, tail(second)
    assert errors[0] == (f"error: saving global_step_4 in {ckpt} failed: No space left on device, injected by "
                         f"LOGICRL_INJECT_FAULT (actor/{shard.name}): free disk there or point "
                         "trainer.default_local_dir elsewhere; global_step_3 is intact and the same command resumes "
                         "from it"), errors[0]
    aside = [p.name for p in ckpt.iterdir() if ".corrupt-" in p.name]
    assert len(aside) == 1 and re.fullmatch(r"global_step_2\.corrupt-\d{8}-\d{6}", aside[0])
    assert (ckpt / aside[0] / "actor" / shard.name).is_file()  # kept for the user, never deleted
    assert damage(ckpt / "global_step_2") is None and damage(ckpt / "global_step_3") is None  # re-saved intact
    assert not (ckpt / "global_step_4").exists() and not [p for p in ckpt.iterdir() if ".tmp-" in p.name]
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "3"
    # Not garbage: the re-run step 2 is the first run's step 2 (same data, RNG and weights), loss and
    # grad norm included (resuming a damaged one would give reward -1 and no loss).
    before, after = metrics(tmp_path / "run1")[2], metrics(tmp_path / "run2")[2]
    for key in ("critic/score/mean", "actor/pg_loss", "actor/grad_norm", "response_length/mean"):
        assert after[key] == pytest.approx(before[key], rel=1e-5, abs=1e-6), key

    # The set-aside one is never picked again: the resume a third run would make, in-process, finds step 3
    # without a warning (a run that then has nothing to do: tests/trainer/test_train_integration.py's sweep).
    with caplog.at_level(logging.WARNING, logger="logicrl"):
        assert find_resume_point(ckpt, "auto") == ckpt / "global_step_3"
    assert [p.name for p in ckpt.iterdir() if ".corrupt-" in p.name] == aside and "is damaged" not in caplog.text

    # Without its manifest nothing vouches for the bytes: NaN written into a shard (same size) passes the
    # check against the DCP index, is found once the rank loaded it, and the run is refused, not trained.
    newest = ckpt / "global_step_3"
    (newest / MANIFEST_FILE).unlink()
    shard = next((newest / "actor").glob("*.distcp"))
    data = bytearray(shard.read_bytes())
    data[len(data) // 2:len(data) // 2 + 4096] = b"\xff" * 4096  # float32 0xffffffff is NaN
    shard.write_bytes(bytes(data))
    third = run_main(*RUN, "trainer.total_training_steps=5", f"trainer.default_local_dir={ckpt}",
                     f"hydra.run.dir={tmp_path / 'run3'}")
    out = third.stdout + third.stderr
    assert f"{newest} has no MANIFEST.json (saved before manifests, or copied without it), so its content is " \
           "unverified" in out and f"verified {newest}" not in out, tail(third)
    errors = [line for line in third.stderr.splitlines() if line.startswith("error: ")]
    assert third.returncode == 2 and len(errors) == 1, tail(third)
    assert re.fullmatch(rf"error: {re.escape(str(newest))} has no MANIFEST\.json to verify it against, and once "
                        r"loaded its actor (optimizer state|weights)( and actor weights)? hold NaN or inf: it "
                        rf"is damaged; move it aside \(mv {re.escape(str(newest))} {re.escape(str(newest))}\.damaged"
                        r"\) and the same command resumes from the one before it, or .*", errors[0]), errors[0]
    assert not (ckpt / "global_step_4").exists() and "the run diverged" not in out

    # The disk estimate the preflight refuses by is close to what a real checkpoint takes. The
    # spec is the saved model's own config: the embedded model's built-in spec counts its config's
    # 2048-token vocabulary, the built model the tokenizer's 763.
    from logicrl.config import compose, validate
    from logicrl.models.spec import load_model_spec
    from logicrl.preflight.disk import checkpoint_bytes
    from logicrl.preflight.memory import plan_for

    cfg, _, plan = validate(compose(RUN))
    saved = load_model_spec(str(ckpt / "global_step_3" / "huggingface"))
    estimate = checkpoint_bytes(plan_for(cfg, saved, plan)[0], cfg.trainer.save_hf_model)
    real = sum(p.stat().st_size for p in (ckpt / "global_step_3").rglob("*") if p.is_file())
    assert 0.95 < estimate / real < 1.15, (estimate, real)


def test_the_manifest_finds_missing_short_and_changed_files(tmp_path):
    (tmp_path / "actor").mkdir()
    (tmp_path / "actor" / "shard.distcp").write_bytes(b"x" * 100)
    (tmp_path / "trainer_state.json").write_text('{"step": 3}')
    (tmp_path / MANIFEST_FILE).write_text(json.dumps(manifest(tmp_path)))
    assert damage(tmp_path) is None
    (tmp_path / "trainer_state.json").write_text('{"step": 4}')  # same size, other bytes
    assert damage(tmp_path) == "trainer_state.json changed since it was saved (CRC-32)"
    (tmp_path / "trainer_state.json").write_text('{"step": 3}')
    (tmp_path / "actor" / "shard.distcp").write_bytes(b"x" * 40)
    assert damage(tmp_path) == "actor/shard.distcp is 40 bytes, 100 when saved"
    (tmp_path / "actor" / "shard.distcp").unlink()
    assert damage(tmp_path) == "actor/shard.distcp is missing"


def test_a_checkpoint_from_before_manifests_is_taken_as_it_is(tmp_path):
    (tmp_path / "trainer_state.json").write_text("{}")
    assert damage(tmp_path) is None


def test_the_stop_hint_says_intact_only_where_a_checkpoint_is(tmp_path):
    from omegaconf import OmegaConf

    import main_ppo

    cfg = OmegaConf.create({"trainer": {"default_local_dir": str(tmp_path)}})
    assert main_ppo.resume_hint(cfg) == f"no checkpoint under {tmp_path} yet: the same command starts over"
    (tmp_path / "global_step_1.tmp-" f"{'0' * 32}").mkdir()  # a save cut short is not a checkpoint
    assert "no checkpoint" in main_ppo.resume_hint(cfg)
    stage = tmp_path / "01_stage1" / "global_step_1"  # a curriculum's are in its stages' directories
    stage.mkdir(parents=True)
    (stage / "COMPLETE").write_text("1\n")
    assert main_ppo.resume_hint(cfg) == f"checkpoints under {tmp_path} are intact: run the same command to resume"
