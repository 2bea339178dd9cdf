"""The GCS watch (controller/cluster.py) without Ray: a stand-in process plays the GCS server. Its
end is seen within a poll; the wait for the ranks then raises the one line; and if the controller
never gets there (blocked in Ray), the watch itself prints the line, ends what the driver started
and exits, after GCS_GRACE_S."""

from __future__ import annotations

import subprocess
import time

import psutil
import pytest

from logicrl.controller import cluster


@pytest.fixture
def fake_gcs(monkeypatch):
    proc = subprocess.Popen(["sleep", "60"])  # not Python: a unit test may start it
    monkeypatch.setattr(cluster, "WATCH_EVERY_S", 0.05)
    yield psutil.Process(proc.pid), proc
    proc.kill()
    proc.wait()


def test_the_gcs_ending_is_one_line_from_the_wait(fake_gcs, monkeypatch):
    gcs, popen = fake_gcs
    watch = cluster._GcsWatch(gcs, "/tmp/ray/session_x/logs")
    monkeypatch.setattr(cluster, "_watch", watch)
    watch.start()
    cluster.check_cluster()  # alive: nothing to say
    assert not cluster.cluster_lost()
    popen.kill()
    popen.wait()  # reaped; a zombie counts as ended too (alive())
    deadline = time.monotonic() + 5
    while not cluster.cluster_lost() and time.monotonic() < deadline:
        time.sleep(0.02)
    with pytest.raises(cluster.ClusterLost, match=rf"^Ray's GCS server \(pid {gcs.pid}\) .* gcs_server.out in "
                                                  r"/tmp/ray/session_x/logs\)"):
        cluster.check_cluster()
    watch.stopping.set()  # what stop_ray does: the controller took the normal way out
    watch.join(timeout=5)
    assert not watch.is_alive()


def test_a_blocked_controller_is_ended_by_the_watch_after_the_grace(fake_gcs, monkeypatch, capsys):
    gcs, popen = fake_gcs
    ended, killed = [], []
    monkeypatch.setattr(cluster, "GCS_GRACE_S", 0.3)
    monkeypatch.setattr(cluster.os, "_exit", ended.append)
    monkeypatch.setattr(cluster, "kill_all", killed.extend)
    watch = cluster._GcsWatch(gcs, "logs")
    watch.start()
    popen.kill()
    popen.wait()
    watch.join(timeout=5)  # the watch's run() returns once its (stubbed) exit is called
    assert ended == [cluster.EXIT_CLUSTER_LOST] == [1]
    err = capsys.readouterr().err.splitlines()
    assert err == [f"error: {watch.lost}"]
    # Everything seen descending from this process since the watch began, the stand-in included.
    assert gcs.pid in {p.pid for p in killed}
