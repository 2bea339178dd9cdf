"""The driver's heartbeat reads and deletes (controller/heartbeat.py) against a private cluster whose GCS server
does not answer (stopped with SIGSTOP: what a GCS that died between two of the GCS watch's polls looks like to
a call already made): each gives up within KV_TIMEOUT_S. Unbounded, such a call held the controller (Ray's
client waits 60 s), and a run whose GCS died ended only by the watch's last resort after GCS_GRACE_S
(test_gcs.py saw it: 22.4 s after the kill)."""

import signal
import time

import pytest

from logicrl.controller import cluster, heartbeat
from logicrl.controller.heartbeat import HeartbeatWatch

pytestmark = pytest.mark.integration


def test_reads_and_deletes_give_up_on_a_gcs_that_does_not_answer(monkeypatch):
    monkeypatch.setattr(heartbeat, "KV_TIMEOUT_S", 0.5)
    cluster.ensure_ray(1, 1, use_cuda=False)
    try:
        watch = HeartbeatWatch(["rank0"], bound_s=60)
        assert watch._read() == [None]  # no beat yet: not started
        (gcs,) = [p for p in cluster.descendants() if p.name() == "gcs_server"]
        gcs.send_signal(signal.SIGSTOP)
        try:
            started = time.monotonic()
            assert watch._read() == [None]  # nothing read: the GCS watch, not this one, names a loss
            watch.forget()
            assert time.monotonic() - started < 2 * heartbeat.KV_TIMEOUT_S + 1
        finally:
            gcs.send_signal(signal.SIGCONT)
    finally:
        cluster.stop_ray()
