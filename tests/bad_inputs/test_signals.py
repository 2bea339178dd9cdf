"""Faults end cleanly: a second SIGTERM mid-step, a preemption notice, SIGTERM mid-start-up, a rank that
raises, a rank that dies. Each ends in bounded time with one `error:` line (the progress bar may stand
above it), no traceback on the console, the checkpoints intact and none of the run's Ray processes left.
Ctrl-C and a first SIGTERM, as a terminal and `timeout` send them (to the whole process group, which
holds the driver alone): test_group_signals.py."""

from __future__ import annotations

import signal
import time
from pathlib import Path

import psutil
import pytest

from logicrl.config.phases import ARR
from tests.conftest import tail
from tests.helpers.signals import assert_gone, finish, intact, one_error_line, start, wait_for

pytestmark = pytest.mark.integration


def test_a_second_sigterm_mid_step_ends_the_run_at_once_with_checkpoints_intact_and_ray_gone(tmp_path):
    # Step 3 stalls in update_actor (faults.py), so it is still in flight when the second signal comes:
    # the first asked for a stop after the step, the second ends the run without waiting for it.
    proc = start(tmp_path, "trainer.total_training_steps=200", fault="stall@update_actor:3")
    wait_for(lambda: (tmp_path / "ckpt" / "global_step_2").is_dir())
    ray = psutil.Process(proc.pid).children(recursive=True)
    assert ray  # Ray's daemons and the rank are the driver's descendants
    for _ in range(2):
        proc.send_signal(signal.SIGTERM)
        # Apart by more than the time the driver's main thread may take to run the first handler on
        # a loaded machine: a repeat that arrives before it is the same pending signal (signals.py).
        time.sleep(1.5)
    returncode, _, err, seconds = finish(proc)
    assert returncode == 143 and one_error_line(err).startswith("error: stopped by SIGTERM; checkpoints under"), \
        tail(err)
    assert seconds < 60
    assert intact(tmp_path / "ckpt")[0] == 1
    assert_gone(ray)


def test_a_stop_request_finishes_the_step_saves_it_and_exits_75(tmp_path):
    """A scheduler's preemption notice (SIGUSR1; SIGTERM's, sent to the group: test_group_signals.py): the
    step in flight ends and is saved though save_freq is not due, the metrics hold every step up to it,
    and the exit code asks for a requeue."""
    sig = signal.SIGUSR1
    proc = start(tmp_path, "trainer.total_training_steps=200", "trainer.save_freq=100")
    wait_for(lambda: (tmp_path / "run" / "metrics.jsonl").is_file()
             and (tmp_path / "run" / "metrics.jsonl").read_text().count("\n") >= 1)
    ray = psutil.Process(proc.pid).children(recursive=True)
    proc.send_signal(sig)
    returncode, _, err, seconds = finish(proc)
    assert returncode == 75, tail(err)
    assert seconds < 60 and "Traceback" not in err
    steps = intact(tmp_path / "ckpt")
    logged = (tmp_path / "run" / "metrics.jsonl").read_text().count("\n")
    assert steps == [logged] and logged < 200
    assert err.rstrip().endswith(f"logicrl: stopped by {sig.name} after step {logged}, with its checkpoint "
                                 f"{tmp_path / 'ckpt' / f'global_step_{logged}'}; run the same command (or requeue "
                                 "the job) to resume"), tail(err)
    assert_gone(ray)


def test_sigterm_while_ray_starts_leaves_nothing_behind(tmp_path):
    proc = start(tmp_path, "trainer.total_training_steps=2")
    wait_for(lambda: psutil.Process(proc.pid).children(recursive=True))  # Ray's first daemon is up
    ray = psutil.Process(proc.pid).children(recursive=True)
    proc.send_signal(signal.SIGTERM)
    returncode, _, err, seconds = finish(proc)
    assert returncode == 143 and one_error_line(err).startswith("error: stop"), tail(err)
    assert seconds < 60
    assert_gone(ray + [c for c in ray if c.is_running()])


@pytest.mark.parametrize("fault, says", [
    ("raise@update_actor:2", "error: rank 0 on node {ip} failed in update_actor: RuntimeError: injected fault in "
                             "update_actor"),
    # make test: a rank that dies is test_a_rank_killed_from_outside... below (its line says "died in").
    pytest.param("die@generate:2", "error: rank 0 on node {ip} died in generate: ", marks=pytest.mark.slow),
])
def test_a_rank_that_fails_is_named_with_its_phase_and_the_traceback_is_in_the_log(tmp_path, fault, says):
    proc = start(tmp_path, "trainer.total_training_steps=3", fault=fault)
    returncode, _, err, seconds = finish(proc, timeout=240)
    line = one_error_line(err)
    ip = line.split(" on node ")[1].split()[0]  # this machine's address, as Ray sees it
    assert returncode == 1 and line.startswith(says.format(ip=ip)), tail(err)
    log = Path(line.rsplit("(traceback in ", 1)[1].rstrip(")"))
    assert "Traceback" in log.read_text()
    assert intact(tmp_path / "ckpt") == [1]


def test_a_rank_killed_from_outside_ends_the_run_within_60_s_naming_it_and_its_node(tmp_path):
    proc = start(tmp_path, "trainer.total_training_steps=200", "trainer.n_gpus=2",
                 f"{ARR}.actor.ppo_mini_batch_size=4")
    wait_for(lambda: (tmp_path / "ckpt" / "global_step_1").is_dir())
    ray = psutil.Process(proc.pid).children(recursive=True)
    ranks = [p for p in ray if "HybridWorker" in " ".join(p.cmdline())]
    assert len(ranks) == 2, [" ".join(p.cmdline()[:2]) for p in ray]
    ranks[1].kill()
    returncode, _, err, seconds = finish(proc)
    line = one_error_line(err)
    assert returncode == 1 and seconds < 60, tail(err)
    assert " on node " in line and " died in " in line, line
    assert intact(tmp_path / "ckpt")[0] == 1
    assert_gone(ray)
