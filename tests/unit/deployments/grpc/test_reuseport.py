"""Serve's direct-ingress gRPC server, started as a replica starts it (no SO_REUSEPORT
asked), holds its port alone once `keep_serves_socket_options` has run: a second
server on the same port fails to bind (Serve then tries the next port) instead of
sharing the connections with the first."""

from __future__ import annotations

import asyncio

import pytest

from cluster.ports import free_port
from deployments.grpc.reuseport import _as_ints, keep_serves_socket_options


def test_the_reuseport_option_becomes_an_int_and_nothing_else_changes():
    assert _as_ints([("grpc.so_reuseport", "0"), ("grpc.x", "abc"), ("grpc.y", 5),
                     ("grpc.primary_user_agent", "123")]) == [
        ("grpc.so_reuseport", 0), ("grpc.x", "abc"), ("grpc.y", 5),
        ("grpc.primary_user_agent", "123")]
    assert _as_ints(None) is None


def test_a_second_serve_grpc_server_on_the_same_port_fails_to_bind():
    pytest.importorskip("ray.serve")
    from ray.serve._private import grpc_util
    from ray.serve.config import gRPCOptions

    assert keep_serves_socket_options(), "Serve's gRPC server class is gone: see reuseport.py"
    assert keep_serves_socket_options()  # a second call patches nothing more
    assert grpc_util.gRPCGenericServer.__mro__[1].__name__ == "gRPCGenericServer"  # patched once

    async def main() -> None:
        loop = asyncio.get_running_loop()
        port = free_port()
        options = gRPCOptions(port=port)
        first = await grpc_util.start_grpc_server(lambda *a, **k: None, options, event_loop=loop,
                                                  enable_so_reuseport=False)
        try:
            with pytest.raises(RuntimeError):
                await grpc_util.start_grpc_server(lambda *a, **k: None, options, event_loop=loop,
                                                  enable_so_reuseport=False)
        finally:
            first[0].cancel()
            await first[1].stop(None)

    asyncio.run(asyncio.wait_for(main(), 60))
