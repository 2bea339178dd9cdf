"""Worker-group calls issued without waiting (controller/pending.py), on the in-process group the GPU tier
drives the trainer with (tests/gpu/local_group.py): the handle holds the ranks' results or the rank's error."""

import pytest

from logicrl.controller.pending import Done, gather
from tests.gpu.local_group import LocalGroup


class Counter:
    def __init__(self, rank: int, world_size: int, master_addr: str, master_port: int, log_file=None, start=0):
        self.rank, self.value = rank, start

    def add(self, amount: int, phase: str = "add") -> int:
        self.value += amount
        return self.value

    def fail(self, *_args, phase: str = "fail"):
        raise RuntimeError(f"rank {self.rank} cannot")


def test_done_keeps_each_ranks_result_in_rank_order():
    done = Done.of("generate", [lambda: 1, lambda: 2])
    assert done.ready() and done.result() == [1, 2]
    assert done.result() == [1, 2]  # waited for twice, the same answer


def test_a_ranks_error_is_raised_where_the_result_is_waited_for_and_the_later_ranks_do_not_run():
    ran = []

    def boom():
        raise ValueError("rank 0 broke")

    done = Done.of("update_actor", [boom, lambda: ran.append(1)])
    assert done.ready() and ran == []
    with pytest.raises(ValueError, match="rank 0 broke"):
        done.result()


def test_gather_waits_for_several_calls_in_the_order_given():
    assert gather(Done("a", [1]), Done("b", [2, 3])) == [[1], [2, 3]]


def test_the_in_process_group_issues_calls_and_the_blocking_forms_wait_on_them():
    group = LocalGroup(Counter, 1, use_cuda=False, start=10)
    first = group.call_async("add", 1)
    second = group.dispatch_async("add", [5])
    assert first.result() == [11] and second.result() == [16]  # issued in order, run in order
    assert group.call("add", 1) == [17] and group.dispatch("add", [2]) == [19]
    failed = group.call_async("fail", phase="reward_model")
    assert failed.phase == "reward_model"
    with pytest.raises(RuntimeError, match="rank 0 cannot"):
        failed.result()
    group.shutdown()
