"""A free TCP port, without Ray: the placement probes call it on each node, and tests and
benchmarks that build workers in-process (no Ray on the machine) call it for the rendezvous."""

from __future__ import annotations

import socket

__all__ = ["free_port", "port_holder"]


def free_port(host: str = "") -> int:
    """A port the kernel had free on `host` just now (another process may still take it first)."""
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_holder(port: int) -> str:
    """Who listens on TCP `port` here, for a line saying why a bind failed: "held by pid N (cmd)"."""
    import psutil  # only on this error path

    try:
        conns = psutil.net_connections(kind="tcp")
    except psutil.AccessDenied:
        return "cannot see which process holds it (no permission to list sockets)"
    pids = sorted({c.pid for c in conns if c.laddr and c.laddr.port == port and c.status == psutil.CONN_LISTEN
                   and c.pid})
    if not pids:
        return "no process here listens on it now (it was taken for a moment, or by another user)"
    holders = []
    for pid in pids:
        try:
            holders.append(f"pid {pid} ({' '.join(psutil.Process(pid).cmdline())[:80]})")
        except psutil.Error:
            holders.append(f"pid {pid}")
    return "held by " + ", ".join(holders)
