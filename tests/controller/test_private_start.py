"""A private cluster's real start (controller/cluster.py ensure_ray -> controller/private.py) when a
port it is to bind was taken between choice and bind: Ray's own failure is recognised, what the
failed start left is cleaned up, and the start is tried again. Ray 2.60 lets the OS pick every
port of a private cluster; the one a user can fix is the GCS's (RAY_GCS_SERVER_PORT), so that one is
held here during the first try and let go after it, as a process that took it for a moment would.
Integration: it starts a real Ray (~15 s, most of it Ray waiting for the GCS that could not bind), in an
interpreter of its own whose environment has Ray's shorter timeouts before Ray is imported: with
RAY_AUTH_MODE set (main_ppo.py pins it, and so does a test that launched in this process), Ray's C++ side
reads its settings at import, and the failed try waited its defaults, 40 s."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

import psutil
import pytest
import ray

from tests.conftest import ROOT, tail

pytestmark = pytest.mark.integration


def test_a_gcs_port_taken_at_the_first_try_is_retried_and_the_cluster_starts():
    code = "from tests.controller.test_private_start import retried_start; retried_start()"
    # Ray waits 5 s per connection try and 30 s in all for a GCS that never started: shorter here. The
    # auth mode as main_ppo.py pins it (logicrl/logs.py pin_ray_auth).
    env = {**os.environ, "PYTHONPATH": str(ROOT), "RAY_AUTH_MODE": "token",
           "RAY_gcs_rpc_server_connect_timeout_s": "2", "RAY_py_gcs_connect_timeout_s": "8"}
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                            env=env)
    assert result.returncode == 0, tail(result)
    assert result.stdout.strip().splitlines()[-1] == "cluster started on the second try", tail(result)


def retried_start() -> None:
    """The scenario, in the interpreter the test starts: asserts, then says so."""
    from logicrl.controller import cluster, private

    held = socket.socket()
    held.bind(("127.0.0.1", 0))
    held.listen()
    port = held.getsockname()[1]
    os.environ["RAY_GCS_SERVER_PORT"] = str(port)  # read by ray.init
    real_init, failures = ray.init, []

    def init(**kwargs):
        try:
            return real_init(**kwargs)
        except Exception as err:
            failures.append((str(err), private.port_in_use(str(err))))
            held.close()  # taken for a moment: free again for the next try
            raise

    ray.init = init
    try:
        cluster.ensure_ray(1, 1, False)
        assert len(failures) == 1 and failures[0][1] == port, failures
        assert ray.is_initialized()
        gcs = ray.get_runtime_context().gcs_address
        assert gcs == f"127.0.0.1:{port}", gcs
        daemons = [p for p in psutil.Process().children(recursive=True) if p.pid != private.reaper_pid()]
        assert daemons and all(os.getsid(p.pid) != os.getsid(0) for p in daemons)  # in sessions of their own
        # No dashboard asked for: neither its head process nor the autoscaler's monitor started.
        started = " ".join(" ".join(p.cmdline()) for p in daemons)
        assert "dashboard/dashboard.py" not in started and "autoscaler/_private/monitor.py" not in started, started
        # One Python worker started ahead, for the one rank (Ray's default: one per CPU).
        assert f"{private.PRESTART}1 " in started, started
    finally:
        held.close()
        cluster.stop_ray()
    assert not [p for p in psutil.Process().children(recursive=True) if p.status() != psutil.STATUS_ZOMBIE]
    print("cluster started on the second try")
