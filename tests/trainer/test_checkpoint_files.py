"""Checkpoint directories on the controller: atomic commit, resume point, pruning, trainer state.

Pure filesystem: the ranks' shards are stood in for by plain files (tests/workers/test_checkpoint_fsdp.py
writes real ones).
"""

import json
import random
import signal
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from logicrl.config.errors import ConfigError
from logicrl.rng import capture_rng_state, restore_rng_state
from logicrl.trainer import checkpoint as ckpt


def save(root: Path, step: int) -> Path:
    with ckpt.saving(root, step) as tmp:
        (tmp / "actor").mkdir()
        (tmp / "actor" / "shard0").write_text(f"weights of step {step}")
        ckpt.write_trainer_state(tmp, ckpt.TrainerState(step=step, sampler_position=step))
    return ckpt.step_dir(root, step)


def test_commit_renames_marks_and_moves_pointer_last(tmp_path):
    path = save(tmp_path, 3)
    assert path == tmp_path / "global_step_3"
    assert (path / ckpt.COMPLETE_MARKER).is_file() and (path / "actor" / "shard0").is_file()
    assert (tmp_path / ckpt.LATEST_FILE).read_text() == "3\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["global_step_3", ckpt.LATEST_FILE]
    save(tmp_path, 5)
    assert ckpt.read_latest_pointer(tmp_path) == 5
    assert ckpt.find_resume_point(tmp_path, "auto") == tmp_path / "global_step_5"


def test_exception_mid_save_keeps_previous(tmp_path):
    save(tmp_path, 1)
    with pytest.raises(RuntimeError, match="rank died"):
        with ckpt.saving(tmp_path, 2) as tmp:
            (tmp / "actor").mkdir()
            raise RuntimeError("rank died")
    assert ckpt.read_latest_pointer(tmp_path) == 1
    assert not tmp.exists() and not (tmp_path / "global_step_2").exists()
    assert ckpt.find_resume_point(tmp_path, "auto") == tmp_path / "global_step_1"


def test_crash_between_rename_and_pointer_resumes_what_the_pointer_names(tmp_path, monkeypatch, caplog):
    """The renamed dir is complete, but the pointer never moved: auto takes what the pointer names (the save
    cut off is done again), and leaves the other as it is."""
    save(tmp_path, 1)
    real = ckpt.write_durably

    def die_on_pointer(path, text):
        if path.name == ckpt.LATEST_FILE:
            raise KeyboardInterrupt  # the process is gone before the pointer moves
        real(path, text)

    monkeypatch.setattr(ckpt, "write_durably", die_on_pointer)
    with pytest.raises(KeyboardInterrupt):
        save(tmp_path, 2)
    monkeypatch.undo()
    assert ckpt.read_latest_pointer(tmp_path) == 1
    assert ckpt.find_resume_point(tmp_path, "auto") == tmp_path / "global_step_1"
    assert ckpt.is_complete(tmp_path / "global_step_2")
    assert "global_step_2 under" in caplog.text and "newer than the step latest_checkpointed_iteration.txt " \
        "names (1)" in caplog.text
    save(tmp_path, 2)  # the resumed run saves its step 2 over it
    assert ckpt.find_resume_point(tmp_path, "auto") == tmp_path / "global_step_2"


def test_auto_resumes_the_step_latest_names_not_the_highest(tmp_path):
    """A run resumed from an older checkpoint by name saves its own steps below an earlier run's higher
    ones: `latest` names the newer run's, and auto, the stop hints and pruning follow it."""
    for step in (1, 2, 3):
        save(tmp_path, step)
    ckpt.write_durably(tmp_path / ckpt.LATEST_FILE, "1\n")  # what a run resumed from global_step_1 would leave
    assert ckpt.find_resume_point(tmp_path, "auto") == tmp_path / "global_step_1"
    assert ckpt.newest_resumable(tmp_path) == tmp_path / "global_step_1"
    assert ckpt.prune(tmp_path, 0) == []  # the one latest names stays; the earlier run's 2 and 3 are not this run's
    assert [s for s, _ in ckpt.complete_checkpoints(tmp_path)] == [1, 2, 3]
    ckpt.write_durably(tmp_path / ckpt.LATEST_FILE, "7\n")  # names one that is gone: the newest below it
    assert ckpt.find_resume_point(tmp_path, "auto") == tmp_path / "global_step_3"
    assert ckpt.read_latest_pointer(tmp_path) == 3  # and the pointer is set to what was resumed
    (tmp_path / ckpt.LATEST_FILE).unlink()  # none at all (a directory from elsewhere): the highest
    assert ckpt.find_resume_point(tmp_path, "auto") == tmp_path / "global_step_3"
    assert ckpt.prune(tmp_path, 1) == [tmp_path / "global_step_1", tmp_path / "global_step_2"]


@pytest.mark.integration
def test_sigkill_mid_save_keeps_previous(tmp_path):
    """A real SIGKILL while shards are being written: the next start resumes from the previous save."""
    save(tmp_path, 1)
    ready = tmp_path.parent / "ready"
    script = textwrap.dedent(f"""
        import time
        from pathlib import Path
        from logicrl.trainer import checkpoint as ckpt
        tmp = ckpt.begin({str(tmp_path)!r}, 2)
        (tmp / "actor").mkdir()
        (tmp / "actor" / "shard0").write_text("half")
        Path({str(ready)!r}).touch()
        time.sleep(60)  # killed here, in the middle of the save
        ckpt.commit(tmp)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=Path(__file__).parents[2])
    try:
        for _ in range(600):
            if ready.exists() or proc.poll() is not None:
                break
            time.sleep(0.02)
        assert ready.exists(), "the saving process did not start"
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    leftovers = [p for p in tmp_path.iterdir() if ".tmp-" in p.name]
    assert len(leftovers) == 1
    assert ckpt.read_latest_pointer(tmp_path) == 1
    assert ckpt.find_resume_point(tmp_path, "auto") == tmp_path / "global_step_1"
    assert not leftovers[0].exists()  # swept by find_resume_point
    assert (tmp_path / "global_step_1" / "actor" / "shard0").read_text() == "weights of step 1"


def test_resaving_a_step_replaces_it(tmp_path):
    save(tmp_path, 4)
    (tmp_path / "global_step_4" / "stale").write_text("x")
    save(tmp_path, 4)
    assert not (tmp_path / "global_step_4" / "stale").exists()
    assert ckpt.is_complete(tmp_path / "global_step_4")
    assert [p.name for p in tmp_path.iterdir() if ".tmp-" in p.name] == []


def test_resume_modes(tmp_path):
    assert ckpt.find_resume_point(tmp_path / "nothing_yet", "auto") is None
    assert ckpt.find_resume_point(tmp_path, "auto") is None
    save(tmp_path, 2)
    (tmp_path / "global_step_9").mkdir()  # a newer dir without COMPLETE (e.g. hand-copied): never chosen
    assert ckpt.find_resume_point(tmp_path, "auto") == tmp_path / "global_step_2"
    assert ckpt.find_resume_point(tmp_path, "disable") is None
    assert ckpt.find_resume_point(tmp_path, str(tmp_path / "global_step_2")) == tmp_path / "global_step_2"
    for bad, why in [(tmp_path / "global_step_9", "not a complete checkpoint"), (tmp_path / "gone", "does not exist")]:
        with pytest.raises(ConfigError, match=why) as err:
            ckpt.find_resume_point(tmp_path, str(bad))
        assert "\n" not in str(err.value) and "trainer.resume_mode" in str(err.value)


def test_stale_tmp_sweep_touches_only_tmp_dirs(tmp_path):
    save(tmp_path, 1)
    stale = ckpt.begin(tmp_path, 2)
    (stale / "actor").mkdir()
    keep = [tmp_path / "notes.txt", tmp_path / "global_step_3.tmp-mine", tmp_path / "global_step_7"]
    keep[0].write_text("mine")
    keep[1].mkdir()  # not a uuid suffix: not ours
    keep[2].mkdir()  # incomplete, but not a tmp dir: left for a human to judge
    assert ckpt.remove_stale_tmp(tmp_path) == [stale]
    assert all(p.exists() for p in keep) and ckpt.is_complete(tmp_path / "global_step_1")


def test_trainer_state_round_trip_restores_rng(tmp_path):
    state = ckpt.TrainerState(step=7, sampler_position=7, kl_coef=0.0123, curriculum_stage=2,
                              rng=capture_rng_state(), extra={"stage_name": "ppl4"})
    draws = (random.random(), np.random.rand(), torch.rand(3))
    ckpt.write_trainer_state(tmp_path, state)
    json.loads((tmp_path / ckpt.STATE_FILE).read_text())  # plain JSON, nothing to unpickle
    loaded = ckpt.read_trainer_state(tmp_path)
    assert loaded == state
    random.seed(99), np.random.seed(99), torch.manual_seed(99)
    restore_rng_state(loaded.rng)
    assert (random.random(), np.random.rand()) == draws[:2] and torch.equal(torch.rand(3), draws[2])


def test_trainer_state_refuses_unknown_format(tmp_path):
    (tmp_path / ckpt.STATE_FILE).write_text(json.dumps({"format": 99, "step": 1, "sampler_position": 1}))
    with pytest.raises(ValueError, match="format 99"):
        ckpt.read_trainer_state(tmp_path)


def test_commit_refuses_foreign_dirs(tmp_path):
    (tmp_path / "global_step_3").mkdir()
    with pytest.raises(ValueError, match="checkpoint.begin"):
        ckpt.commit(tmp_path / "global_step_3")
    ckpt.abort(tmp_path / "global_step_3")  # not a tmp dir: abort must not delete it
    assert (tmp_path / "global_step_3").is_dir()


@settings(max_examples=40, deadline=None)
@given(complete=st.sets(st.integers(0, 30), max_size=8), incomplete=st.sets(st.integers(0, 30), max_size=3),
       keep=st.one_of(st.none(), st.integers(-1, 6)), latest=st.one_of(st.none(), st.integers(0, 30)))
def test_prune_invariants(complete, incomplete, keep, latest):
    incomplete = incomplete - complete
    with tempfile.TemporaryDirectory() as d:
        root = Path(d)
        for step in complete:
            (root / f"global_step_{step}").mkdir()
            (root / f"global_step_{step}" / ckpt.COMPLETE_MARKER).write_text(f"{step}\n")
        for step in incomplete:
            (root / f"global_step_{step}").mkdir()
        if latest is not None:
            (root / ckpt.LATEST_FILE).write_text(f"{latest}\n")
        (root / "summary.md").write_text("not a checkpoint")

        removed = ckpt.prune(root, keep)

        left = [s for s, _ in ckpt.complete_checkpoints(root)]
        # This run's: at or below the step latest names; those above it are an earlier run's and stay.
        ours = sorted(s for s in complete if latest is None or s <= latest)
        theirs = sorted(s for s in complete if latest is not None and s > latest)
        if keep is None or keep == -1:
            assert left == sorted(complete) and removed == []
        else:
            kept = ours[max(0, len(ours) - max(1, keep)):]
            assert left == sorted(kept + theirs)
            assert sorted(removed) == sorted(root / f"global_step_{s}" for s in ours[:len(ours) - len(kept)])
        if ours:
            assert max(ours) in left  # the newest complete checkpoint of this run always stays
        assert all((root / f"global_step_{s}").is_dir() for s in incomplete)
        assert (root / "summary.md").read_text() == "not a checkpoint"
        assert not [p for p in root.iterdir() if ".tmp-" in p.name]  # nothing half-deleted left behind
