"""Ray itself failing under a run: its private cluster's GCS server killed mid-run. Without it no
call into the cluster completes (Ray's own processes give up after 60 s, silently for logicrl); the
run ends in seconds with one line naming the GCS, the checkpoints intact and none of its processes left."""

from __future__ import annotations

import time

import psutil
import pytest

from logicrl.controller.cluster import GCS_GRACE_S
from tests.conftest import tail
from tests.helpers.signals import assert_gone, finish, intact, one_error_line, start, wait_for

pytestmark = pytest.mark.integration


def session_processes(sid: int) -> list[psutil.Process]:
    """Processes still in the run's session (run_main starts it in its own): what it started later too."""
    found = []
    for proc in psutil.process_iter():
        try:
            if proc.pid != sid and psutil.os.getsid(proc.pid) == sid and proc.status() != psutil.STATUS_ZOMBIE:
                found.append(proc)
        except (psutil.Error, OSError):
            continue
    return found


def test_the_gcs_server_killed_mid_run_ends_it_in_one_line_and_leaves_nothing(tmp_path):
    proc = start(tmp_path, "trainer.total_training_steps=200")  # save_freq=1: a checkpoint every step
    wait_for(lambda: (tmp_path / "ckpt" / "global_step_2").is_dir())
    started = psutil.Process(proc.pid).children(recursive=True)  # the GCS, raylet, agents, workers, rank
    gcs = [p for p in started if p.name() == "gcs_server"]
    assert len(gcs) == 1, [p.name() for p in started]
    gcs[0].kill()
    killed_at = time.monotonic()
    returncode, _, err, _ = finish(proc)
    seconds = time.monotonic() - killed_at
    line = one_error_line(err)
    assert returncode == 1, tail(err)
    assert line.startswith(f"error: Ray's GCS server (pid {gcs[0].pid}) of this run's private Ray cluster ended"), line
    assert "gcs_server.out" in line and "run the same command again" in line, line
    # By the controller's own way out, not the watch thread's last resort after GCS_GRACE_S (a shutdown that
    # waited on the dead GCS took that one: 22 s).
    assert seconds < GCS_GRACE_S, f"{seconds:.1f} s after the kill"
    assert_gone(started)
    assert session_processes(proc.pid) == []
    assert intact(tmp_path / "ckpt")[-1] >= 2  # the checkpoints it had are still there, complete
