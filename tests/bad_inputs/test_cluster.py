"""Joining a Ray cluster: one too small for the ranks, or none at the address, fails in seconds
with one line saying what was asked for and what is there (not a wait forever on placement).

The module starts one head (`ray start --head --block`, own temp dir and port) and stops it by
its pid: --block makes that process take its daemons down with it. Never `ray stop`: it would
stop every cluster on the machine.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.bad_inputs.conftest import refused, small_run, timed_main
from tests.conftest import tail


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


@dataclass
class Head:
    address: str  # host:port, for RAY_ADDRESS
    tmpdir: str  # its RAY_TMPDIR: <tmpdir>/ray/ray_current_cluster records it, where a bare ray.init() looks
    process: subprocess.Popen


@pytest.fixture(scope="module")
def one_cpu_head():
    """One `ray start --head` with 1 CPU for the module's tests (a head's start costs ~5 CPU s): joined
    by address, and found by a run through its RAY_TMPDIR's record."""
    port = free_port()
    # Short: Ray's unix sockets live under it, and their paths may not pass 107 bytes.
    temp = tempfile.mkdtemp(prefix="lr-rt-", dir="/tmp")
    ray = Path(sys.executable).with_name("ray")
    env = {**os.environ, "RAY_TMPDIR": temp, "RAY_AUTH_MODE": "disabled", "RAY_USAGE_STATS_ENABLED": "0"}
    env.pop("RAY_ADDRESS", None)
    head = subprocess.Popen([str(ray), "start", "--head", "--block", "--num-cpus=1", f"--port={port}",
                             "--include-dashboard=false", f"--ray-client-server-port={free_port()}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, start_new_session=True)
    try:
        recorded = Path(temp) / "ray" / "ray_current_cluster"
        deadline = time.monotonic() + 90
        while not recorded.is_file() and head.poll() is None and time.monotonic() < deadline:
            time.sleep(0.5)
        assert recorded.is_file(), "the test's Ray head did not start"
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                time.sleep(0.5)
        else:
            pytest.fail("the test's Ray head did not answer in 90 s")
        time.sleep(3)  # the GCS answers before the raylet has registered the node's CPUs
        yield Head(f"127.0.0.1:{port}", temp, head)
    finally:
        head.send_signal(signal.SIGTERM)
        try:
            head.wait(timeout=30)
        except subprocess.TimeoutExpired:
            os.killpg(head.pid, signal.SIGKILL)  # its own session: only what it started
        shutil.rmtree(temp, ignore_errors=True)


@pytest.mark.integration
def test_a_cluster_too_small_for_the_ranks_is_one_line(tmp_path, one_cpu_head):
    result, seconds = timed_main(*small_run(tmp_path), "trainer.n_gpus=2",
                                 env={"RAY_ADDRESS": one_cpu_head.address, "RAY_AUTH_MODE": "disabled"})
    refused(result, seconds, "trainer.n_gpus=2 needs 2 CPU but the Ray cluster has 1 CPU", bound=60)


@pytest.mark.integration
def test_an_address_where_no_cluster_answers_is_one_line(tmp_path):
    address = f"127.0.0.1:{free_port()}"
    result, seconds = timed_main(*small_run(tmp_path), env={"RAY_ADDRESS": address})
    refused(result, seconds, f"RAY_ADDRESS={address}: no Ray cluster answers there", bound=45)


@pytest.mark.integration
def test_a_cluster_already_running_here_is_left_alone(tmp_path, one_cpu_head):
    """`ray start` records its cluster in <RAY_TMPDIR>/ray/ray_current_cluster, where a bare
    ray.init() finds and joins it (anyone's, e.g. another job's on a shared node), then fails
    because a joined cluster refuses num_cpus. Without trainer.ray_address a run starts its own."""
    result, _ = timed_main(*small_run(tmp_path), env={"RAY_TMPDIR": one_cpu_head.tmpdir, "RAY_AUTH_MODE": "disabled"})
    assert result.returncode == 0, tail(result)
    assert one_cpu_head.process.poll() is None  # the other cluster still runs
