"""The SLURM wrapper's node step (logicrl/launch/slurm.py run_node) on this machine, without SLURM: a
port chosen free and taken by someone else before `ray start` binds it is retried with other ports;
the head is published only once its own processes listen. Integration: it starts a real Ray head."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from logicrl.launch.slurm import HEAD_FILE
from tests.conftest import ROOT, tail

pytestmark = pytest.mark.integration

# The node step with its first choice of one port replaced by a port this test holds.
NODE = """
import sys
from logicrl.launch import slurm
real, index, taken = slurm.free_ports, int(sys.argv[2]), int(sys.argv[3])
calls = []
def free_ports(ip, n):
    ports = real(ip, n)
    if not calls:
        ports[index] = taken
    calls.append(ports)
    return ports
slurm.free_ports = free_ports
sys.exit(slurm.main(["node", sys.argv[1]]))
"""


@pytest.mark.parametrize("index, server", [(1, "the client server's")])
def test_a_head_port_taken_between_choice_and_bind_is_retried_with_another(tmp_path, index, server):
    job = tmp_path / "job"
    job.mkdir()
    holder = socket.socket()
    holder.bind(("0.0.0.0", 0))  # every interface, as Ray's servers bind
    holder.listen()
    taken = holder.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "SLURMD_NODENAME": "n1", "SLURM_NODEID": "0",
           "SLURM_JOB_ID": f"ports{os.getpid()}", "SLURM_STEP_ID": "0", "SLURM_CPUS_ON_NODE": "1",
           "LOGICRL_NODE_NETWORK": "127.0.0.1/32", "TMPDIR": "/tmp", "RAY_USAGE_STATS_ENABLED": "0"}
    proc = subprocess.Popen([sys.executable, "-c", NODE, str(job), str(index), str(taken)], env=env, cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while not (job / HEAD_FILE).exists():
            assert proc.poll() is None and time.monotonic() < deadline, tail(proc.communicate()[1])
            time.sleep(0.5)
        address = (job / HEAD_FILE).read_text()
        assert not address.endswith(f":{taken}")
    finally:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        holder.close()
    assert f"port {taken} on 127.0.0.1 was taken before Ray bound it (held by pid {os.getpid()} " in err, tail(err)
    assert "starting Ray again on other ports" in err
    assert not Path(f"/tmp/ray-ports{os.getpid()}-n1").exists()
