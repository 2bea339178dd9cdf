"""The driver's heartbeat reads and deletes (controller/heartbeat.py) against a private cluster whose GCS server
was just killed: each gives up within KV_TIMEOUT_S. Unbounded, a GCS that died between two of the GCS watch's
polls held the controller in the read (Ray's client waits 60 s), and the run ended only by the watch's last
resort after GCS_GRACE_S (test_gcs.py saw it: 22.4 s after the kill)."""

import time

import pytest

from logicrl.controller import cluster
from logicrl.controller.heartbeat import BEAT_S, KV_TIMEOUT_S, HeartbeatWatch

pytestmark = pytest.mark.integration


def test_reads_and_deletes_give_up_on_a_dead_gcs_within_the_bound():
    cluster.ensure_ray(1, 1, use_cuda=False)
    try:
        watch = HeartbeatWatch(["rank0"], bound_s=60)
        assert watch._read() == [None]  # no beat yet: not started
        (gcs,) = [p for p in cluster.descendants() if p.name() == "gcs_server"]
        gcs.kill()
        gcs.wait()
        time.sleep(BEAT_S)  # silent() reads at most once per BEAT_S
        started = time.monotonic()
        assert watch.silent() is None  # nothing read: the GCS watch, not this one, names the loss
        watch.forget()
        assert time.monotonic() - started < 2 * KV_TIMEOUT_S + 1
        deadline = time.monotonic() + 5
        while not cluster.cluster_lost() and time.monotonic() < deadline:
            time.sleep(0.1)
        assert cluster.cluster_lost()
    finally:
        cluster.stop_ray()
