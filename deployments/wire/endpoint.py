"""Where a direct connection (`deployments.wire.link`) listens and how a caller reaches it:
a Unix socket for a caller on the actor's own node, TCP on the node's address for one
from another node.

Why: on one node every hop of the actor path (ingress to batching actor, batching actor
to replica) is a socket between two processes, and TCP over loopback pays the whole TCP
stack for it. A Unix stream socket carries the same frames with less of the kernel's time
on both sides and a shorter round trip, for small frames and a batch's 64 KB alike
(`python -m benchmarks.serve.hop_floor` times both; figures in docs/performance.md). The
frames, the token and the heartbeat are the same on both: only the address differs.

The Unix socket's name is in Linux's abstract namespace (a leading NUL: no file to
create, to remove after a crash, or to collide with a stale one; visible only inside the
node's network namespace, which is where its callers are, as for 127.0.0.1). Elsewhere
(no abstract namespace) a same-node caller gets TCP on 127.0.0.1, as before.
"""

from __future__ import annotations

import asyncio
import os
import secrets
import socket
import sys
from collections.abc import Callable
from typing import Any

SAME_NODE = "same-node"  # `listen_host`'s answer for a caller on the actor's own node
UNIX = sys.platform.startswith("linux") and hasattr(socket, "AF_UNIX")


def is_unix(host: str) -> bool:
    """Is `host` (as `link_address` hands it out) a Unix socket's name?"""
    return host.startswith("\0")


def _unix_name() -> str:
    return f"\0raybatch-link-{os.getpid()}-{secrets.token_hex(6)}"


def listen_socket(host: str, backlog: int = 64) -> socket.socket:
    """A listening socket for callers that `listen_host` called `host`."""
    if host == SAME_NODE:
        if UNIX:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            try:
                sock.bind(_unix_name())
                sock.listen(backlog)
            except OSError:
                sock.close()
                raise
            return sock
        host = "127.0.0.1"
    family = socket.AF_INET6 if ":" in host else socket.AF_INET  # a node's IPv6 address
    return socket.create_server((host, 0), family=family, backlog=backlog)


def address_of(sock: socket.socket) -> tuple[str, int]:
    """(host, port) a caller connects to: a Unix socket's name and 0, or TCP's pair."""
    name = sock.getsockname()
    if sock.family == getattr(socket, "AF_UNIX", None):
        return (name.decode() if isinstance(name, bytes) else name), 0
    return name[0], name[1]


async def connect(factory: Callable[[], Any], host: str, port: int) -> tuple[Any, Any]:
    """`loop.create_connection` to a TCP address, or a connection to a Unix socket's name
    (connected first, then handed over: uvloop, Ray's loop in an async actor, refuses an
    abstract name as `create_unix_connection`'s path)."""
    loop = asyncio.get_running_loop()
    if not is_unix(host):
        return await loop.create_connection(factory, host, port)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.setblocking(False)
        await loop.sock_connect(sock, host)
        return await loop.create_unix_connection(factory, sock=sock)
    except BaseException:
        sock.close()
        raise


def no_delay(sock: socket.socket) -> None:
    """TCP_NODELAY on a TCP socket (a Unix socket has no Nagle to turn off)."""
    if sock.family in (socket.AF_INET, socket.AF_INET6):
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)


__all__ = ["SAME_NODE", "UNIX", "address_of", "connect", "is_unix", "listen_socket",
           "no_delay"]
