"""Where ranks go, from what the probes in their bundles saw (no Ray: the choice is pure).

A loopback simulation of two nodes cannot catch a rendezvous on the wrong host (every 127/8
address reaches the same kernel), so the rule is tested here on its own: the address and port
are rank 0's node's, whatever node the driver runs on.
"""

from __future__ import annotations

import pytest

from logicrl.controller.placement import PIN, Where, bundles, pick_nodes, rendezvous, thread_cap, threads_per_rank
from logicrl.controller.worker_group import thread_env


def node(ip: str) -> dict:
    return {"NodeManagerAddress": ip}


def test_the_rendezvous_is_rank_0s_node_not_the_drivers():
    where = [Where("b", "10.0.0.7", 8, 41234), Where("a", "10.0.0.5", 8, None)]
    assert rendezvous(where) == ("10.0.0.7", 41234)


def test_threads_come_from_each_ranks_own_node():
    # Node a: 16 CPUs in Ray, 3 ranks; node b: 4 CPUs in Ray but the process may run on only 2 cores.
    where = [Where("a", "10.0.0.5", 64, 1), Where("a", "10.0.0.5", 64, None), Where("a", "10.0.0.5", 64, None),
             Where("b", "10.0.0.6", 2, None)]
    assert threads_per_rank(where, {"a": 16.0, "b": 4.0}) == [5, 5, 5, 2]
    # A node with fewer CPUs than ranks still gives each rank one thread.
    assert threads_per_rank(where, {"a": 2.0, "b": 4.0}) == [1, 1, 1, 2]
    # OMP_NUM_THREADS=3 caps every rank's share (5 -> 3), never raises one (2 stays 2).
    assert threads_per_rank(where, {"a": 16.0, "b": 4.0}, cap=3) == [3, 3, 3, 2]


@pytest.mark.parametrize("value, cap", [("4", 4), ("1", 1), (None, None), ("", None), ("0", None), ("2,1", None)])
def test_the_thread_cap_is_a_positive_omp_num_threads(monkeypatch, value, cap):
    if value is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", value)
    assert thread_cap() == cap


def test_nodes_are_the_drivers_first_then_by_address():
    nodes = [node("10.0.0.10"), node("10.0.0.9"), node("10.0.0.2"), node("10.0.0.9")]
    assert pick_nodes(nodes, 2, driver_ip="10.0.0.9") == ["10.0.0.9", "10.0.0.2"]
    assert pick_nodes(nodes, 3, driver_ip="192.168.1.1") == ["10.0.0.2", "10.0.0.9", "10.0.0.10"]


def test_bundles_put_n_per_node_on_each_node_in_rank_order():
    got = bundles(4, use_cuda=True, node_ips=["10.0.0.2", "10.0.0.3"])
    assert got == [{"CPU": 1, "GPU": 1, "node:10.0.0.2": PIN}] * 2 + [{"CPU": 1, "GPU": 1, "node:10.0.0.3": PIN}] * 2
    assert bundles(2, use_cuda=False, node_ips=None) == [{"CPU": 1}, {"CPU": 1}]


@pytest.mark.parametrize("private, omp, threads, env", [
    # A private cluster's workers inherit this driver's OMP_NUM_THREADS: the same count needs no runtime_env.
    (True, "1", 1, None),
    # Another count, or none inherited: the rank's own (its worker starts with it).
    (True, "4", 2, {"env_vars": {"OMP_NUM_THREADS": "2"}}),
    (True, None, 2, {"env_vars": {"OMP_NUM_THREADS": "2"}}),
    # A joined cluster's workers inherit its head's environment, not this driver's: always set.
    (False, "1", 1, {"env_vars": {"OMP_NUM_THREADS": "1"}}),
])
def test_a_ranks_runtime_env_sets_only_what_its_worker_does_not_inherit(monkeypatch, private, omp, threads, env):
    if omp is None:
        monkeypatch.delenv("OMP_NUM_THREADS", raising=False)
    else:
        monkeypatch.setenv("OMP_NUM_THREADS", omp)
    assert thread_env(threads, private) == env
