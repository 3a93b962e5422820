"""Ports for servers are chosen outside the kernel's ephemeral range, free, never twice."""

from __future__ import annotations

import itertools
import socket

from cluster import ports


def test_a_port_is_free_between_rays_worker_ports_and_the_ephemeral_range():
    low = ports._ephemeral_low()
    given = [ports.free_port() for _ in range(50)]
    assert len(set(given)) == 50  # never handed out twice by one process
    for port in given:
        assert ports._LOWEST <= port < low
        with socket.socket() as s:
            s.bind(("127.0.0.1", port))  # still free: nothing holds it


def test_a_taken_port_is_passed_over(monkeypatch):
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        taken = held.getsockname()[1]
        # the taken port first, then others (any of which a neighbour may hold too)
        draws = itertools.chain([taken], (p for p in range(20_000, 65_536) if p != taken))
        monkeypatch.setattr(ports.random, "randrange", lambda a, b: next(draws))
        monkeypatch.setattr(ports, "_ephemeral_low", lambda: 65536)
        assert ports.free_port() != taken


def test_without_room_below_the_ephemeral_range_the_kernel_picks(monkeypatch):
    monkeypatch.setattr(ports, "_ephemeral_low", lambda: ports._LOWEST + 10)
    port = ports.free_port()
    with socket.socket() as s:
        s.bind(("127.0.0.1", port))
