"""Ray worker-group calls issued without waiting (controller/worker_group.py call_async / dispatch_async):
the controller gets a handle at once, each rank runs its calls in the order issued, and a rank's failure
is raised where the step waits, naming the rank and the phase."""

import time

import pytest

from logicrl.controller.cluster import stop_ray
from logicrl.controller.worker_group import WorkerFailed, WorkerGroup

pytestmark = pytest.mark.integration


class Sleeper:
    def __init__(self, rank: int, world_size: int, master_addr: str, master_port: int, threads: int | None = None):
        self.rank, self.log = rank, []

    def nap(self, seconds: float, phase: str = "nap") -> int:
        time.sleep(seconds)
        self.log.append(seconds)
        return self.rank

    def seen(self) -> list:
        return list(self.log)

    def fail(self, _shard=None, phase: str = "fail"):
        raise ValueError(f"rank {self.rank} refused")


@pytest.fixture(scope="module")
def group():
    g = WorkerGroup(Sleeper, 2, use_cuda=False)
    yield g
    g.shutdown()
    stop_ray()


def test_a_call_returns_its_handle_before_the_ranks_finish(group):
    start = time.perf_counter()
    slow = group.call_async("nap", 1.5)
    issued = time.perf_counter() - start
    assert issued < 1.0 and not slow.ready()
    after = group.dispatch_async("nap", [0.0, 0.1])  # queued behind the slow call on each rank
    assert slow.result() == [0, 1] and after.result() == [0, 1]
    assert slow.ready() and after.ready()
    assert group.call("seen") == [[1.5, 0.0], [1.5, 0.1]]  # each rank ran them in the order issued


def test_a_ranks_failure_is_raised_at_the_wait_naming_rank_and_phase(group):
    failed = group.dispatch_async("fail", [None, None], phase="values")
    with pytest.raises(WorkerFailed, match=r"rank (\d) .*failed in values: ValueError: rank \1 refused"):
        failed.result()
