"""Ranks on a Ray cluster of several nodes (three loopback "nodes" on this machine): placed
`n_gpus_per_node` to a node, the rendezvous on rank 0's node, threads from each node's CPUs; a
node lost mid-call ends the call promptly, naming the rank and the node."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest

from tests.conftest import tail

pytestmark = pytest.mark.integration
ROOT = Path(__file__).resolve().parents[2]


def probe(*mode: str) -> dict:
    temp = tempfile.mkdtemp(prefix="lr-mn-", dir="/tmp")  # short: Ray's socket paths live under it
    env = {**os.environ, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0", "PYTHONPATH": str(ROOT)}
    env.pop("RAY_ADDRESS", None)
    try:
        out = subprocess.run([sys.executable, "-m", "tests.controller.multinode_probe", temp, *mode], cwd=ROOT,
                             env=env, capture_output=True, text=True, timeout=240)
    finally:
        shutil.rmtree(temp, ignore_errors=True)
    assert out.returncode == 0, tail(out)
    return json.loads(next(line for line in out.stdout.splitlines() if line.startswith("PROBE "))[6:])


@pytest.fixture(scope="module")
def seen() -> dict:
    """One cluster for the three tests: the ranks report where they are, two one-rank groups broadcast
    between nodes, then rank 1's node is lost."""
    return probe("lose-node")


def test_two_nodes_one_rank_each_rendezvous_on_rank_0s_node(seen):
    ranks = seen["ranks"]
    assert seen["driver"] == "127.0.0.2"
    assert [r["node"] for r in ranks] == ["127.0.0.3", "127.0.0.4"]  # one per node, by address
    assert {r["master_addr"] for r in ranks} == {"127.0.0.3"}  # rank 0's node, not the driver's
    assert len({r["master_port"] for r in ranks}) == 1
    assert [r["threads"] for r in ranks] == [2, 1]  # each node's own CPUs
    assert [r["omp"] for r in ranks] == ["2", "1"]


def test_one_step_off_groups_on_two_nodes_broadcast_at_the_trainer_ranks_node(seen):
    two = seen["two_groups"]
    # The only free CPUs are one on 127.0.0.3 and one on 127.0.0.5: each group on a node of its own.
    assert {two["trainer"]["node"], two["rollout"]["node"]} == {"127.0.0.3", "127.0.0.5"}, two
    assert two["address"] == two["trainer"]["node"]  # the weight group meets on the trainer rank's node
    assert two["rollout"]["got"] == two["trainer"]["got"] == [0.0, 1.0, 2.0, 3.0, 4.0, 5.0]


def test_a_lost_node_ends_the_call_within_60_s_naming_its_rank_and_node(seen):
    lost = seen["lost"]
    # Rank 1 sits on 127.0.0.4, the node removed (raylet and workers killed) 2 s into a 300 s call.
    assert lost["error"] is not None and lost["seconds"] < 60, lost
    assert (lost["rank"], lost["node"]) == (1, "127.0.0.4"), lost
    assert lost["error"].startswith("rank 1 on node 127.0.0.4 died in hold: "), lost
