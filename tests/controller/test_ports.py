"""Saying who holds a port (controller/ports.py), finding a taken port in Ray's message
(controller/private.py) and among the ports a node chose (launch/slurm.py)."""

from __future__ import annotations

import os
import socket

import pytest

from logicrl.controller.ports import free_port, port_holder
from logicrl.controller.private import port_in_use
from logicrl.launch.slurm import taken_ports


def test_a_held_port_names_its_holder_and_a_free_one_says_none_holds_it():
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        assert port_holder(port).startswith(f"held by pid {os.getpid()} (")
        assert taken_ports("127.0.0.1", [port, free_port("127.0.0.1")]) == [port]
    assert port_holder(port).startswith("no process here listens on it now")


def test_the_port_in_an_address_in_use_message():
    assert port_in_use("Failed to bind to address 0.0.0.0:43077: Address already in use") == 43077
    assert port_in_use("[Errno 98] Address already in use") == 0  # a bind failure naming no port
    assert port_in_use("The current node timed out during startup") is None


def test_a_private_start_that_keeps_failing_on_a_taken_port_is_retried_then_names_it(monkeypatch):
    from logicrl.controller import private

    tries, cleaned = [], []
    monkeypatch.setattr(private, "start_reaper", lambda: None)
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]

        def init(**kwargs):
            tries.append(kwargs)
            raise RuntimeError(f"Failed to bind to address 127.0.0.1:{port}: Address already in use")

        with pytest.raises(private.PortsTaken) as refused:
            private.start_private(init, lambda: cleaned.append(1), num_cpus=1)
    assert len(tries) == len(cleaned) == private.START_ATTEMPTS
    assert tries[0]["_node_ip_address"] == "127.0.0.1" and tries[0]["address"] == "local"
    assert str(refused.value).startswith(f"Ray's private cluster could not bind port {port} (held by pid "
                                         f"{os.getpid()} ")


def test_a_private_start_failing_otherwise_is_not_retried(monkeypatch):
    from logicrl.controller import private

    tries = []
    monkeypatch.setattr(private, "start_reaper", lambda: None)

    def init(**kwargs):
        tries.append(1)
        raise RuntimeError("The current node timed out during startup")

    with pytest.raises(RuntimeError, match="timed out"):
        private.start_private(init, lambda: None)
    assert tries == [1]


def test_a_log_timestamp_in_ray_s_message_is_not_taken_for_the_port():
    # Ray's message for a GCS that could not bind: its log line's time (06:54:06) comes before the port.
    message = ("Failed to start GCS.  Last 1 lines of error files:\n[2026-12-06 06:54:06,641 C 22039 22039] "
               "(gcs_server) grpc_server.cc:134: Check failed: server_ Failed to start the grpc server. The "
               "specified port is 39989. This means that Ray's core components will not be able to function")
    assert port_in_use(message) == 39989
    assert port_in_use("bind [::]:5555 failed: Address already in use") == 5555
