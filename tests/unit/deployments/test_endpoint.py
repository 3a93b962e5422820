"""`deployments.wire.endpoint`: a caller on the actor's own node reaches its direct connection
through a Unix socket (abstract name), one from another node through TCP; both servers
(the batching actor's asyncio one, the replica's threaded one) and both event loops
(asyncio, and uvloop, Ray's loop in an async actor) carry calls on it, a wrong token is
still refused, and a server that goes away fails what is open at once."""

from __future__ import annotations

import asyncio
import socket

import numpy as np
import pytest

from deployments.replica.link_server import ThreadedLinkServer
from deployments.wire import dialer
from deployments.wire.endpoint import (
    SAME_NODE,
    UNIX,
    address_of,
    connect,
    is_unix,
    listen_socket,
)
from deployments.wire.keepalive import DEFAULT
from deployments.wire.link import Link, LinkLost, LinkServer
from tests.conftest import HANG_S, until

pytestmark = pytest.mark.skipif(not UNIX, reason="Unix sockets with abstract names: Linux only")

LOOPS = ["asyncio", "uvloop"]


def run(coro, loop: str = "asyncio", timeout_s: float = HANG_S):
    if loop == "uvloop":
        uvloop = pytest.importorskip("uvloop", reason="uvloop comes with ray[serve]")
        return uvloop.run(asyncio.wait_for(coro, timeout_s))
    return asyncio.run(asyncio.wait_for(coro, timeout_s))


def test_same_node_listens_on_an_abstract_unix_socket_and_other_nodes_on_tcp():
    local = listen_socket(SAME_NODE)
    tcp = listen_socket("127.0.0.1")
    try:
        name, port = address_of(local)
        assert local.family == socket.AF_UNIX and port == 0
        assert is_unix(name) and name.startswith("\0raybatch-link-"), name
        host, port = address_of(tcp)
        assert tcp.family == socket.AF_INET and host == "127.0.0.1" and port > 0
        assert not is_unix(host)
        assert address_of(listen_socket(SAME_NODE))[0] != name  # a name of its own each
    finally:
        local.close()
        tcp.close()


def test_a_node_with_an_ipv6_address_listens_on_it():
    if not socket.has_ipv6:
        pytest.skip("no IPv6 on this machine")
    try:
        sock = listen_socket("::1")
    except OSError as e:  # a kernel without IPv6, or ::1 not configured
        pytest.skip(f"::1 cannot be bound here: {e}")
    try:
        host, port = address_of(sock)
        assert sock.family == socket.AF_INET6 and host == "::1" and port > 0
    finally:
        sock.close()


def test_listen_host_says_same_node_only_for_the_actors_own_node(monkeypatch):
    import ray

    monkeypatch.setattr(dialer, "node_id", lambda: "node-a")
    monkeypatch.setattr(ray.util, "get_node_ip_address", lambda: "198.18.0.7")
    assert dialer.listen_host("node-a") == SAME_NODE
    assert dialer.listen_host("node-b") == "198.18.0.7"
    assert dialer.listen_host(None) == "198.18.0.7"


@pytest.mark.parametrize("loop", LOOPS)
def test_a_replica_takes_batches_over_the_unix_socket(loop):
    """In band (a small batch) and out of band (a large one) both arrive whole."""
    server = ThreadedLinkServer(lambda items: (items * 2, 0.5), workers=1)
    address = server.address(SAME_NODE)

    async def main():
        link = await Link.open_to(*address, keepalive=DEFAULT)
        try:
            small = np.arange(8, dtype=np.float32).reshape(2, 4)
            large = np.random.default_rng(0).random((64, 1024), dtype=np.float32)
            return small, large, await link.call(small), await link.call(large)
        finally:
            link.close()

    try:
        small, large, (got_small, s1), (got_large, s2) = run(main(), loop)
    finally:
        server.close()
    assert np.array_equal(got_small, small * 2) and np.array_equal(got_large, large * 2)
    assert s1 == s2 == 0.5 and server.calls == 2


@pytest.mark.parametrize("loop", LOOPS)
def test_a_batching_actor_takes_bundles_over_the_unix_socket(loop):
    seen = []

    async def infer(bundle, caller):
        seen.append(caller)
        return [x + 1 for x in bundle]

    async def cancel(caller, keys):
        seen.append(("cancel", caller, keys))

    async def main():
        server = LinkServer(infer, cancel)
        link = await Link.open_to(*await server.address(SAME_NODE), keepalive=DEFAULT)
        answers = await asyncio.gather(*(link.call([i, i], "ingress-1") for i in range(20)))
        link.cancel("ingress-1", ["k"])
        await until(lambda: len(seen) == 21, "the cancel")
        hosts = sorted(server.servers)
        link.close()
        server.close()
        return answers, hosts

    answers, hosts = run(main(), loop)
    assert answers == [[i + 1, i + 1] for i in range(20)]
    assert seen == ["ingress-1"] * 20 + [("cancel", "ingress-1", ["k"])]
    assert hosts == [SAME_NODE]


def test_a_wrong_token_on_the_unix_socket_runs_nothing():
    ran = []
    server = ThreadedLinkServer(lambda items: ran.append(items) or items, workers=1)
    name, _, token = server.address(SAME_NODE)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.settimeout(5)
        sock.connect(name)
        sock.sendall(bytes(len(token)) + b"anything at all")
        try:
            assert sock.recv(100) == b""  # ended, nothing answered
        except ConnectionResetError:  # ended with our bytes unread: a reset
            pass
    finally:
        sock.close()
        server.close()
    assert ran == []


def test_a_server_that_goes_away_fails_the_open_call_at_once():
    """No heartbeat needed on one node: the peer's end closes with its process."""
    import threading

    gate = threading.Event()
    server = ThreadedLinkServer(lambda items: gate.wait(10) and items, workers=1)
    address = server.address(SAME_NODE)

    async def main():
        link = await Link.open_to(*address)  # no keepalive: only the socket can tell
        call = link.call([1])
        def running() -> bool:
            with server.lock:  # its accept thread adds to the set
                return any(c.busy for c in server.connections)

        await until(running, "the batch running")
        server.close()
        try:
            return await asyncio.wait_for(call, 10)
        except LinkLost as e:
            return e
        finally:
            gate.set()

    assert isinstance(run(main()), LinkLost)


def test_nobody_listening_is_an_error_not_a_hang():
    async def main():
        await connect(asyncio.Protocol, "\0raybatch-link-nobody-here", 0)

    with pytest.raises(ConnectionRefusedError):
        run(main())
