"""A free TCP port, without Ray: the placement probes call it on each node, and tests and
benchmarks that build workers in-process (no Ray on the machine) call it for the rendezvous."""

from __future__ import annotations

import socket

__all__ = ["free_port"]


def free_port(host: str = "") -> int:
    """A port the kernel had free on `host` just now (another process may still take it first)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]
