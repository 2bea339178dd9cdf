"""Damaged checkpoints: the newest one cut short is set aside with one warning, never deleted, and
the run resumes from the newest intact one (not a traceback on every re-run)."""

from __future__ import annotations

import json
import re

import pytest

from logicrl.trainer.checkpoint import MANIFEST_FILE, damage, manifest
from tests.bad_inputs.conftest import timed_main
from tests.conftest import ROLE_DATA, TINY_RUN, tail

RUN = [*ROLE_DATA, *TINY_RUN, "trainer.save_freq=1"]


@pytest.mark.integration
def test_a_truncated_newest_checkpoint_is_set_aside_and_the_run_resumes_from_the_one_before(tmp_path):
    ckpt = tmp_path / "ckpt"
    first, _ = timed_main(*RUN, "trainer.total_training_steps=2", f"trainer.default_local_dir={ckpt}",
                          f"hydra.run.dir={tmp_path / 'run1'}")
    assert first.returncode == 0, tail(first)
    shard = next((ckpt / "global_step_2" / "actor").glob("*.distcp"))
    shard.write_bytes(shard.read_bytes()[: shard.stat().st_size // 2])  # a copy that stopped halfway

    second, seconds = timed_main(*RUN, "trainer.total_training_steps=3", f"trainer.default_local_dir={ckpt}",
                                 f"hydra.run.dir={tmp_path / 'run2'}")
    assert second.returncode == 0, tail(second)
    out = second.stdout + second.stderr
    warnings = [line for line in out.splitlines() if "is damaged" in line]
    assert len(warnings) == 1 and f"{ckpt / 'global_step_2'} is damaged (actor/{shard.name} is" in warnings[0]
    assert f"resumed from {ckpt / 'global_step_1'} at step 1" in out
    aside = [p.name for p in ckpt.iterdir() if ".corrupt-" in p.name]
    assert len(aside) == 1 and re.fullmatch(r"global_step_2\.corrupt-\d{8}-\d{6}", aside[0])
    assert (ckpt / aside[0] / "actor" / shard.name).is_file()  # kept for the user, never deleted
    assert damage(ckpt / "global_step_2") is None and damage(ckpt / "global_step_3") is None  # re-saved intact
    assert (ckpt / "latest_checkpointed_iteration.txt").read_text().strip() == "3"

    # The set-aside one is never picked again: a third run finds step 3 and has nothing to do.
    third, _ = timed_main(*RUN, "trainer.total_training_steps=3", f"trainer.default_local_dir={ckpt}",
                          f"hydra.run.dir={tmp_path / 'run3'}")
    assert third.returncode == 0 and "is damaged" not in third.stdout + third.stderr
    assert "already holds step 3 of 3" in third.stdout

    # The disk estimate the preflight refuses by is close to what a real checkpoint takes. The
    # spec is the saved model's own config: the embedded model's built-in spec counts its config's
    # 2048-token vocabulary, the built model the tokenizer's 763.
    from logicrl.config import compose, validate
    from logicrl.preflight.disk import checkpoint_bytes
    from logicrl.preflight.memory import plan_for
    from logicrl.models.spec import load_model_spec

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
