"""Saying who holds a port (controller/ports.py), finding a taken port in Ray's message
(controller/private.py) and among the ports a node chose (launch/slurm.py)."""

from __future__ import annotations

import os
import socket

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
