"""The CPU allocation tracker: exact live tensor bytes, whatever the allocator keeps."""

import torch

from logicrl.memory.tracker import PeakTracker, live_tensor_bytes

MB = 1_000_000


def test_peak_counts_tensors_alive_before_and_the_highest_point_inside():
    before = torch.ones(10 * MB // 4)  # 10 MB alive when the block starts
    with PeakTracker("cpu") as t:
        a = torch.ones(25 * MB // 4)  # 25
        b = torch.ones(12 * MB // 4)  # 37: the peak inside
        del a
        c = torch.ones(20 * MB // 4)  # 32
        del b, c
    assert t.peak_bytes - t.start_bytes == 37 * MB
    assert t.start_bytes >= 10 * MB
    del before


def test_a_second_block_starts_from_its_own_baseline():
    keep = []
    with PeakTracker("cpu") as first:
        keep.append(torch.ones(8 * MB // 4))  # stays alive after the block
    with PeakTracker("cpu") as second:
        x = torch.ones(4 * MB // 4)
        del x
    assert first.peak_bytes - first.start_bytes == 8 * MB
    assert second.peak_bytes - second.start_bytes == 4 * MB
    assert second.start_bytes - first.start_bytes >= 8 * MB


def test_storage_resize_is_counted():
    # FSDP2 frees and re-gathers unsharded parameters by resizing their storage.
    t = torch.ones(MB // 4)
    with PeakTracker("cpu") as tracker:
        t.untyped_storage().resize_(0)
        t.untyped_storage().resize_(6 * MB)
    assert tracker.peak_bytes - tracker.start_bytes == 6 * MB


def test_a_stale_size_freed_inside_the_block_does_not_cancel_its_allocations():
    """c10 keeps the size of a block allocated under an earlier profiler and freed without one; a
    new block malloc puts at that address reports that size when the block frees it. That free
    must not cancel the block's own allocations (it did: a 6 MB resize measured 0 in a full run)."""
    from types import SimpleNamespace

    from torch._C._profiler import _EventType

    from logicrl.memory.tracker import _max_running_total

    def event(t, ptr, size, total):
        fields = SimpleNamespace(device=torch.device("cpu"), ptr=ptr, alloc_size=size, total_allocated=total, id=t)
        return SimpleNamespace(tag=_EventType.Allocation, extra_fields=fields, start_time_ns=t, children=[])

    # 100 MB of the process's earlier profiled blocks; the stale 8 MB entry at 0xA is freed first.
    events = [event(1, 0xA, -8 * MB, 92 * MB), event(2, 0xB, 6 * MB, 98 * MB), event(3, 0xC, 2 * MB, 100 * MB),
              event(4, 0xC, -2 * MB, 98 * MB), event(5, 0xD, 1 * MB, 99 * MB)]
    root = SimpleNamespace(tag=None, children=events[::-1])  # the tree is not in time order
    prof = SimpleNamespace(profiler=SimpleNamespace(kineto_results=SimpleNamespace(
        experimental_event_tree=lambda: [root])))
    assert _max_running_total(prof) == 8 * MB


def test_live_bytes_count_shared_storage_once():
    base = torch.zeros(MB // 4)
    before = live_tensor_bytes()
    views = [base[:10], base.view(-1, 2), base]
    assert live_tensor_bytes() == before
    del views
