"""LOGICRL_INJECT_FAULT's grammar (logicrl/faults.py): where each fault fires, and on which rank."""

import errno

import pytest

from logicrl.faults import Fault, Faults, parse


def test_a_fault_can_name_a_stage_and_a_rank():
    assert parse("sigkill@save:4, oom@update_actor:2#3@rank1,raise@generate:1@rank0") == {
        ("save", 4, None): Fault("sigkill"),
        ("update_actor", 2, 3): Fault("oom", 1),
        ("generate", 1, None): Fault("raise", 0),
    }


@pytest.mark.parametrize("spec, says", [
    ("oom@update_actor:2@1", "cannot parse"),  # the rank is written rankN
    ("oom@update_actor:2@rank1@rank0", "cannot parse"),
    ("oom@update_actor", "cannot parse"),
    ("boom@update_actor:2", "unknown fault kind 'boom'"),
    ("sigkill@update_actor:2@rank1", "drop @rank1"),  # the controller has no rank
])
def test_malformed_faults_are_refused_with_the_spelling(spec, says):
    with pytest.raises(ValueError, match=says):
        parse(spec)


def test_an_oom_aimed_at_one_rank_fires_there_once():
    faults = Faults(parse("oom@update_actor:2@rank1"))
    assert faults.oom_due("update_actor", 2, rank=0) is None
    assert faults.oom_due("update_actor", 1, rank=1) is None
    assert faults.oom_due("update_actor", 2, rank=1) == Fault("oom", 1)
    assert faults.oom_due("update_actor", 2, rank=1) is None  # once per point and step, as a transient OOM


def test_an_oom_for_every_rank_fires_on_each():
    for rank in (0, 1):  # each rank holds its own copy of the object
        assert Faults(parse("oom@old_log_prob:3")).oom_due("old_log_prob", 3, rank) == Fault("oom", None)


def test_a_raise_aimed_at_one_rank_spares_the_others():
    faults = Faults(parse("raise@values:2@rank1"))
    faults.fail_worker_if_due("values", 2, rank=0)
    with pytest.raises(RuntimeError, match="injected fault in values at step 2"):
        faults.fail_worker_if_due("values", 2, rank=1)


def test_a_stall_sleeps_in_its_phase_only(monkeypatch):
    import logicrl.faults as faults_module

    slept = []
    monkeypatch.setattr(faults_module.time, "sleep", slept.append)
    faults = Faults(parse("stall@update_actor:3"))
    faults.fail_worker_if_due("update_actor", 2, rank=0)
    faults.fail_worker_if_due("generate", 3, rank=0)
    assert slept == []
    faults.fail_worker_if_due("update_actor", 3, rank=0)
    assert slept == [faults_module.STALL_S]


def test_disk_faults_fire_at_save_only_as_the_file_system_s_own_error():
    faults = Faults(parse("enospc@save:2,erofs@save:3@rank1"))
    full = faults.disk_error_due("save", 2, rank=0)
    assert isinstance(full, OSError) and full.errno == errno.ENOSPC and full.filename is None  # the writer names it
    assert faults.disk_error_due("save", 3, rank=0) is None
    assert faults.disk_error_due("save", 3, rank=1).errno == errno.EROFS
    assert faults.disk_error_due("save", 1, rank=0) is None
    with pytest.raises(ValueError, match="enospc fails a checkpoint write: its point is save"):
        parse("enospc@update_actor:2")


def test_a_taken_port_is_for_the_slurm_head_s_start_in_the_run_named():
    faults = Faults(parse("taken@ray_start:1"))
    assert faults.port_taken_due(1) and not faults.port_taken_due(0)  # the requeued run's, not the first's
    for spec in ("taken@update_actor:1", "stall@ray_start:1"):
        with pytest.raises(ValueError, match="a port is taken at ray_start"):
            parse(spec)
