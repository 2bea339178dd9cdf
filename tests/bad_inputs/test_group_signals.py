"""Signals as launchers send them: to the launch's whole process group (`timeout`, `docker stop`, a
terminal), to every process of the run (a cgroup's kill), or SIGKILL to the driver. The private Ray
cluster runs in sessions of its own (controller/private.py), so a group's signal reaches the driver
alone; whatever way the driver ends, none of its cluster's processes is left. Processes are found
by the sessions the run's processes lead, never by name: other Ray clusters run on this machine."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest

from logicrl.run_lock import one_run_per_directory
from logicrl.trainer.checkpoint import find_resume_point
from tests.conftest import ROOT, run_main, tail
from tests.helpers.signals import RUN, finish, intact, one_error_line, start, wait_for

pytestmark = pytest.mark.integration


def steps_logged(tmp_path: Path) -> int:
    metrics = tmp_path / "run" / "metrics.jsonl"
    return metrics.read_text().count("\n") if metrics.is_file() else 0


def cluster_of(pid: int) -> tuple[set[int], set[int]]:
    """The driver's descendants and the sessions they lead or belong to (the driver's own aside)."""
    own = os.getsid(pid)
    kids = {p.pid for p in psutil.Process(pid).children(recursive=True)}
    sessions = set()
    for kid in kids:
        try:
            sessions.add(os.getsid(kid))
        except OSError:
            pass
    return kids, sessions - {own}


def alive_in(pids: set[int], sessions: set[int]) -> list[str]:
    """What still runs of `pids` or of `sessions` (a process the cluster started after we looked)."""
    left = []
    for proc in psutil.process_iter(["pid", "name", "status"]):
        try:
            if proc.info["status"] == psutil.STATUS_ZOMBIE:
                continue
            if proc.pid in pids or os.getsid(proc.pid) in sessions:
                left.append(f"{proc.pid} {proc.info['name']}")
        except (OSError, psutil.Error):
            pass
    return left


def assert_none_left(pids: set[int], sessions: set[int], within_s: float = 10) -> None:
    deadline = time.monotonic() + within_s
    while (left := alive_in(pids, sessions)) and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not left, left


def listening(pids: set[int]) -> list[str]:
    """`ss -ltnp` for these pids: every listening TCP socket of theirs, as "ip:port pid N"."""
    return [f"{conn.laddr.ip}:{conn.laddr.port} pid {conn.pid}" for conn in psutil.net_connections(kind="tcp")
            if conn.pid in pids and conn.status == psutil.CONN_LISTEN]


def test_sigterm_to_the_group_saves_the_step_in_flight_exits_75_and_leaves_nothing(tmp_path):
    proc = start(tmp_path, "trainer.total_training_steps=200", "trainer.save_freq=100")
    wait_for(lambda: steps_logged(tmp_path) >= 1)
    pids, sessions = cluster_of(proc.pid)
    # A private one-machine cluster listens on loopback only: GCS, raylet, workers, agents.
    sockets = listening(pids | {proc.pid})
    outside = [s for s in sockets if not s.startswith(("127.0.0.1:", "::ffff:127.0.0.1:"))]
    assert sessions and len(sockets) >= 3 and not outside, sockets  # the GCS, the raylet, a worker at least
    os.killpg(proc.pid, signal.SIGTERM)  # what `timeout`, `docker stop` (with an init) and `kill -- -PGID` do
    returncode, _, err, seconds = finish(proc)
    assert returncode == 75, tail(err)
    assert seconds < 60 and "Traceback" not in err and "GCS" not in err
    step = steps_logged(tmp_path)
    assert intact(tmp_path / "ckpt") == [step]
    assert err.rstrip().endswith(f"logicrl: stopped by SIGTERM after step {step}, with its checkpoint "
                                 f"{tmp_path / 'ckpt' / f'global_step_{step}'}; run the same command (or requeue "
                                 "the job) to resume"), tail(err)
    assert_none_left(pids, sessions)


def test_sigint_to_the_group_stops_with_the_checkpoints_intact(tmp_path):
    # Step 3 stalls in update_actor (faults.py): Ctrl-C comes with a step in flight.
    proc = start(tmp_path, "trainer.total_training_steps=200", fault="stall@update_actor:3")
    wait_for(lambda: (tmp_path / "ckpt" / "global_step_2").is_dir())
    pids, sessions = cluster_of(proc.pid)
    os.killpg(proc.pid, signal.SIGINT)  # a terminal's Ctrl-C: the foreground job's whole group
    returncode, _, err, seconds = finish(proc)
    assert returncode == 130 and one_error_line(err).startswith("error: interrupted (Ctrl-C); checkpoints under"), \
        tail(err)
    assert seconds < 60 and intact(tmp_path / "ckpt")[:2] == [1, 2]
    assert_none_left(pids, sessions)


def test_sigkill_of_the_driver_leaves_no_process_of_its_cluster_nor_its_directory_locked(tmp_path):
    proc = start(tmp_path, "trainer.total_training_steps=200", fault="stall@update_actor:2")
    wait_for(lambda: steps_logged(tmp_path) >= 1)
    pids, sessions = cluster_of(proc.pid)
    assert sessions
    # A second launch on the same checkpoint directory is refused while the first lives ...
    second = run_main(*RUN, f"trainer.default_local_dir={tmp_path / 'ckpt'}", f"hydra.run.dir={tmp_path / 'run2'}",
                      cwd=tmp_path)
    line = one_error_line(second.stderr)
    assert second.returncode == 2 and line.startswith(
        f"error: trainer.default_local_dir={tmp_path / 'ckpt'} is in use by another run (pid {proc.pid} on "), \
        tail(second)
    proc.kill()  # the driver alone, no clean-up of its own
    proc.communicate(timeout=30)
    assert_none_left(pids, sessions, within_s=10)
    # ... and after the first died by SIGKILL, the kernel has released its lock, and no process of its cluster
    # holds it (a descriptor they inherited would): the lock a third launch takes first is free (taken here,
    # in-process), and that launch would resume the first's step 1. A SIGKILLed run resumed by the same command,
    # launched: tests/trainer/test_curriculum_resume.py.
    with one_run_per_directory(tmp_path / "ckpt"):
        pass
    assert find_resume_point(tmp_path / "ckpt", "auto") == tmp_path / "ckpt" / "global_step_1"


@pytest.mark.slow  # make test: the GCS killed mid-run (test_gcs.py), the group's signals above
def test_a_signal_to_every_process_of_the_run_ends_it_in_one_line_naming_the_intact_checkpoint(tmp_path):
    """A cgroup's kill (SLURM's time limit, `docker stop` of a shell): Ray's processes get the signal
    too, so the step in flight cannot be saved; the run says so in one line, in bounded time, never
    with Ray's own "Failed to connect to GCS" a minute later."""
    proc = start(tmp_path, "trainer.total_training_steps=200", fault="stall@update_actor:3")
    wait_for(lambda: (tmp_path / "ckpt" / "global_step_2").is_dir())
    pids, sessions = cluster_of(proc.pid)
    for pid in [proc.pid, *pids]:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    returncode, _, err, seconds = finish(proc)
    line = one_error_line(err)
    assert returncode == 143, tail(err)
    assert line.startswith("error: stopped by SIGTERM, which reached this run's Ray processes too"), tail(err)
    assert line.endswith(f"{tmp_path / 'ckpt' / 'global_step_2'} is intact: run the same command to resume from it")
    assert seconds < 45 and intact(tmp_path / "ckpt")[:2] == [1, 2]
    assert_none_left(pids, sessions)


@pytest.mark.slow  # make test: the group's SIGTERM above, and timeout's echo in test_stop_requests.py
def test_a_run_under_gnu_timeout_saves_the_step_when_timeout_signals(tmp_path):
    """`timeout` sends its signal to the command, then to the command's whole group (the command
    again): one request. SIGTERM to `timeout` itself is what its expiry does, without waiting for it."""
    timeout = shutil.which("timeout")
    if timeout is None:
        pytest.skip("no GNU timeout here")
    argv = [timeout, "900", sys.executable, str(ROOT / "main_ppo.py"), *RUN, "trainer.total_training_steps=200",
            "trainer.save_freq=100", f"trainer.default_local_dir={tmp_path / 'ckpt'}",
            f"hydra.run.dir={tmp_path / 'run'}"]
    env = {k: v for k, v in os.environ.items() if k != "LOGICRL_INJECT_FAULT"}
    proc = subprocess.Popen(argv, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**env, "HYDRA_FULL_ERROR": "0", "OMP_NUM_THREADS": "1"}, start_new_session=True)
    wait_for(lambda: steps_logged(tmp_path) >= 1)
    driver = psutil.Process(proc.pid).children()[0].pid
    pids, sessions = cluster_of(driver)
    proc.send_signal(signal.SIGTERM)
    returncode, _, err, seconds = finish(proc)
    step = steps_logged(tmp_path)
    assert returncode == 75 and intact(tmp_path / "ckpt") == [step], tail(err)
    assert err.rstrip().endswith("run the same command (or requeue the job) to resume") and "Traceback" not in err
    assert_none_left(pids, sessions)
