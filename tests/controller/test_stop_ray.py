"""stop_ray (controller/cluster.py) ends its cluster's processes and only those: a process the driver had
started before the cluster (a notebook's, a test process's launch server) is neither waited for nor killed.
It was both: every in-process cluster's stop waited 5 s on this test process's launch server, then killed it."""

import subprocess
import sys
import time

import psutil
import pytest

from logicrl.controller.cluster import descendants, stop_ray
from logicrl.controller.worker_group import WorkerGroup

pytestmark = pytest.mark.integration


class Idle:
    def __init__(self, rank: int, world_size: int, master_addr: str, master_port: int, threads: int | None = None):
        self.rank = rank

    def ping(self, phase: str = "ping") -> int:
        return self.rank


def test_stop_ray_leaves_what_the_driver_started_before_its_cluster():
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(300)"])
    try:
        group = WorkerGroup(Idle, 1, use_cuda=False)
        assert group.call("ping") == [0]
        cluster = descendants()
        names = {p.name() for p in cluster}
        assert {"gcs_server", "raylet"} <= names and bystander.pid not in {p.pid for p in cluster}, names
        group.shutdown()
        started = time.monotonic()
        stop_ray()
        seconds = time.monotonic() - started
        assert bystander.poll() is None  # still running
        assert seconds < 5, seconds  # not waited for (what is left after ray.shutdown gets 5 s)
        _, left = psutil.wait_procs(cluster, timeout=5)
        assert left == [], left  # the cluster's own processes all ended
    finally:
        bystander.kill()
        bystander.wait()
