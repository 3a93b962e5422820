"""Ports for servers about to bind them, chosen where no outgoing connection can take them.

A port the kernel picks (a bind to port 0) comes from its ephemeral range, the one it
also gives every outgoing connection its local port from: between choosing it and the
server's own bind, any process's next connection may take it. On a busy machine (two test
lanes side by side, each with Ray's many connections) that happened: an ingress could not
bind the port it was given. Below the ephemeral range and above Ray's worker ports, only
listeners take ports, so one is drawn there at random and checked free.
"""

from __future__ import annotations

import random
import socket

_GIVEN: set[int] = set()  # ports this process handed out: not handed out twice
_LOWEST = 20000  # above Ray's worker ports (10002-19999 by default)


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on now, for a server about to bind it: drawn between
    Ray's worker ports and the kernel's ephemeral range and checked free (the kernel's
    own pick only where that fails)."""
    top = _ephemeral_low()
    for _ in range(100 if top > _LOWEST + 1000 else 0):
        port = random.randrange(_LOWEST, top)
        if port in _GIVEN:
            continue
        with socket.socket() as s:
            try:
                s.bind((host, port))
            except OSError:
                continue
        _GIVEN.add(port)
        return port
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def _ephemeral_low() -> int:
    """The lowest port of the kernel's ephemeral range (Linux; 32768 where unknown)."""
    try:
        with open("/proc/sys/net/ipv4/ip_local_port_range") as f:
            return int(f.read().split()[0])
    except (OSError, ValueError, IndexError):
        return 32768
