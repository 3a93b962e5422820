"""Raybatch's own HTTP/1.1 server: the OIP app on a port of each ingress replica.

Why: under Serve's direct ingress, uvicorn answers each request through its
ASGI cycle, two socket writes, a keep-alive timer reset and its middlewares: for an app
that answers `{}` that is far more CPU per request than this server spends
(`benchmarks.http.front`), and serving `mlp` it was a large share of an ingress
replica's samples (`benchmarks.serve.profile_ingress`; figures in docs/protocol.md). This
server does what the OIP app needs and no more: httptools parses, one small
`Cycle` per request carries the ASGI `receive`/`send`, and a response goes out
in ONE write when its length is known (status line, headers and body; a
zero-copy response's parts in one `writelines`); streams (SSE) go out chunked,
one write per event. Keep-alive idleness is checked by one sweep a second for all
connections, not a timer per request.

What it keeps of a proper server (the rules are `deployments.http.pyserver.connection`'s):
pipelined requests are answered in order, one at a time, with at most
`max_pipelined` parsed ahead; a client that does not read its answers stops being
read once `max_unsent_bytes` wait to go out; a request body is buffered up to
`READ_BUFFER_BYTES`, past which the socket stops being read until the app takes it
(and `BodyReader` still refuses a large body at the piece that crosses the limit);
a head must arrive whole within `header_timeout_s` and stay under
`max_header_bytes` (431, a URL 414) whether its lines end or not; framing is strict
(RFC 9112, `deployments.http.pyserver.framing`); `Expect: 100-continue` is answered when the
app first asks for the body; an `Upgrade` (WebSocket, h2c) is ignored (answered in
HTTP/1.1, then closed); a client's end of input (FIN) still gets the answers to what
it sent whole, and so does a client whose later input is refused (the error comes
after them); an error close lingers so the client reads the error, not a reset; a
client that goes away wakes the app's `receive` with `http.disconnect` (SSE
generations end); writes wait while the client's socket buffer is full; an app error
before the response starts is a 500 `{"error"}`, after it the connection closes.
Connections idle longer than `keep_alive_s` are closed; past `max_connections`, the
longest-idle one makes room (or a new one gets 503 when none is idle).

The quick lane: a POST whose whole body fits the read buffer may be taken by the app's
`quick` (`OipApp.quick`: infer requests) once its body is whole, and answered from the
engine's callback with `Cycle.respond`: no task, no coroutine, no ASGI message per
request, the costs left after the server's own (a bare protocol answering `{}` costs a
fraction of what this server spends with the ASGI cycle). Anything else, or a body still
arriving after the next one-second sweep (so `BodyReader`'s stall timeout still applies),
goes through the ASGI app as before; pipelined requests keep their order across both.

Turns: the loop (uvloop, libuv) runs its ready callbacks between polls of the sockets, but
one poll goes on while the kernel keeps handing it 1,024 ready sockets at a time (up to 48
rounds): under a flood of clients (thousands of connections, each sending its next request
as soon as it is answered or refused) it parsed and refused requests for seconds on end
while finished batches, Ray's calls and timers waited, so accepted requests were answered
seconds late (docs/protocol.md). So a turn of the loop parses at most `TURN_READS` reads;
past them a connection's bytes are kept unparsed (its socket is no longer read once they
pass a buffer's worth) until the next turn, which parses the waiting ones first, oldest
first. 64, not more: while a burst is being read, each finished batch waits for the rest
of its turn, so the turn's length is the engine's batch cycle then (at 64 the first
batches of a burst came back sooner than at 256, and none of it was refused; admission
predicts the burst's wait from them: `benchmarks/results/2026-11-26-admission-overload/`).
Under ordinary load (fewer ready sockets than that per turn) nothing waits; at 128
connections the wait costs no system call.

`SO_REUSEPORT`: every ingress replica of a node binds the same port and the
kernel spreads connections across them, as Serve's own proxies do. The kernel
would as gladly spread them across two different apps of the same user, giving
one app's clients the other's answers: `claim_port` refuses that (a small file per
port, per node, names the app whose live processes hold it). The request/response
cycle (ASGI `receive`/`send`, framing) is `deployments.http.pyserver.cycle`.
"""

from __future__ import annotations

import asyncio
import logging
import os
import resource
import socket
import time
from collections import deque
from typing import Any

from deployments.http.pyserver.connection import FIRST_SLICE, Connection
from deployments.http.pyserver.cycle import READ_BUFFER_BYTES
from deployments.http.pyserver.portclaim import claim_port, release_port

TURN_READS = 64  # reads parsed in one turn of the event loop; past them, the next turn
# Descriptors kept free of connections: Ray's own sockets and files, the native front's
# slots for 503s past the limit, the logs.
SPARE_DESCRIPTORS = 128

log = logging.getLogger("deployments.http")


def connection_room(wanted: int) -> int:
    """`wanted` (ingress.max_connections), or fewer where the process may not open that many
    descriptors (RLIMIT_NOFILE, less what is open and SPARE_DESCRIPTORS): past the limit
    every accept fails, so the limit is kept below it and said once."""
    soft, _ = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft == resource.RLIM_INFINITY:
        return wanted
    try:
        in_use = len(os.listdir("/proc/self/fd"))
    except OSError:
        in_use = 64
    room = max(8, soft - in_use - SPARE_DESCRIPTORS)
    if wanted <= room:
        return wanted
    log.warning("ingress.max_connections is %d but this process may open %d descriptors "
                "(RLIMIT_NOFILE, %d in use): serving at most %d connections; raise the limit "
                "(ulimit -n) to serve more", wanted, soft, in_use, room)
    return room


class HttpServer:
    """Serves `app` (an ASGI callable) on `host:port` from the running loop.

    >>> server = HttpServer(app.direct, host="0.0.0.0", port=8080)   # doctest: +SKIP
    >>> await server.start(); ...; await server.stop(10)             # doctest: +SKIP
    """

    def __init__(self, app: Any, *, host: str = "127.0.0.1", port: int = 0,
                 reuse_port: bool = True, keep_alive_s: float = 75.0,
                 max_header_bytes: int = 16 * 2**10, route_prefix: str = "/",
                 owner: str | None = None, quick: Any = None,
                 header_timeout_s: float = 10.0, max_connections: int = 10_000,
                 max_unsent_bytes: int = 2**20, max_pipelined: int = 16) -> None:
        self.app, self.host, self.port = app, host, port
        # The app's quick lane (`OipApp.quick`): called with a request whose body is
        # whole; True if it took it (it calls `cycle.respond` exactly once), else the
        # ASGI app answers. None: every request goes through the ASGI app.
        self.quick = quick
        self.owner = owner  # with reuse_port: the app whose processes may share the port
        # ASGI's root_path: the app's routes answer under the prefix, and without it
        self.root_path = route_prefix.rstrip("/")
        self.reuse_port, self.keep_alive_s = reuse_port, keep_alive_s
        self.max_header_bytes = max_header_bytes
        # A head is the request line (URL up to max_header_bytes) and the headers (as
        # many): past both, and a slice of slack, it is refused however its lines end.
        self.max_head_bytes = 2 * max_header_bytes + FIRST_SLICE + 1024
        self.header_timeout_s = header_timeout_s
        self.max_connections = max_connections
        self.max_unsent_bytes = max_unsent_bytes
        self.max_pipelined = max_pipelined
        self.connections: set[Connection] = set()
        self.turn_reads = TURN_READS
        self._reads = 0  # reads parsed in this turn of the loop
        self._waiting: deque[Connection] = deque()  # connections whose reads wait a turn
        self._turn_due = False  # `_next_turn` is scheduled
        self._server: asyncio.AbstractServer | None = None
        self._claimed = 0  # the port claimed (claim_port), released on close
        self._sweeper: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    @classmethod
    def from_config(cls, app: Any, ingress: Any, **kwargs: Any) -> HttpServer:
        """The server `ingress` (an `IngressConfig`) describes, on `ingress.native_port`."""
        return cls(app, host=ingress.host, port=ingress.native_port,
                   keep_alive_s=ingress.keep_alive_s, max_header_bytes=ingress.max_header_bytes,
                   route_prefix=ingress.route_prefix, header_timeout_s=ingress.header_timeout_s,
                   max_connections=ingress.max_connections,
                   max_unsent_bytes=ingress.max_unsent_bytes,
                   max_pipelined=ingress.max_pipelined_requests, **kwargs)

    async def start(self) -> None:
        """Bind and listen; `port` 0 takes a free port (read `self.port` after)."""
        self._loop = loop = asyncio.get_running_loop()
        self.max_connections = connection_room(self.max_connections)
        sock = self._bind()
        self._server = await loop.create_server(lambda: Connection(self), sock=sock,
                                                backlog=2048)
        self._sweeper = loop.call_later(1.0, self._sweep)

    def _bind(self) -> socket.socket:
        """The listening socket (the port claimed first, with `reuse_port`)."""
        if self.reuse_port and self.port and self.owner is not None:
            claim_port(self.port, self.owner)
            self._claimed = self.port
        family = socket.AF_INET6 if ":" in self.host else socket.AF_INET
        sock = socket.socket(family, socket.SOCK_STREAM)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            if self.reuse_port:
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
            sock.bind((self.host, self.port))
        except OSError as e:
            sock.close()
            raise RuntimeError(f"the ingress's HTTP server cannot bind {self.host}:{self.port}"
                               f" ({e.strerror}): another process holds that port; choose "
                               "another ingress.native_port, or null to serve through Serve "
                               "only") from e
        self.port = sock.getsockname()[1]
        return sock

    def close(self) -> None:
        """Stop accepting; requests in progress go on (see `stop`)."""
        if self._server is not None:
            self._server.close()
        if self._claimed:
            port, self._claimed = self._claimed, 0
            release_port(port)
        if self._sweeper is not None:
            self._sweeper.cancel()
            self._sweeper = None

    async def stop(self, timeout_s: float) -> None:
        """Stop accepting, close idle connections, give the rest `timeout_s` to finish
        their responses, then close whatever is left."""
        self.close()
        give_up = time.monotonic() + timeout_s
        while True:
            for c in list(self.connections):
                if not c.busy:
                    c.close()
            if not self.connections or time.monotonic() >= give_up:
                break
            await asyncio.sleep(0.05)
        for c in list(self.connections):
            c.close()

    def admit(self, conn: Connection) -> None:
        """A new connection. At `max_connections`, the one that has held a slot longest
        without a request under way (idle between requests, or still sending a head) makes
        room; if every one has a request under way, the new one gets 503 and closes."""
        if len(self.connections) >= self.max_connections:
            idle = [c for c in self.connections if not c.busy]
            if idle:
                victim = min(idle, key=lambda c: c.head_since or c.last_read)
                victim.close()
                self.connections.discard(victim)
            else:
                conn.rejection = (503, f"this server holds {len(self.connections)} "
                                       "connections, its limit (ingress.max_connections); "
                                       "retry shortly")
                conn.no_more = True
                self.connections.add(conn)  # until its lingering close ends
                conn.pump()
                return
        self.connections.add(conn)

    def turn_spent(self, conn: Connection) -> bool:
        """A read arrived on `conn`: False if this turn of the loop parses it now; True if
        the turn has parsed `turn_reads` already (or others wait before it): `conn` waits
        for the next turn (its bytes kept, its socket not read meanwhile)."""
        if not self._turn_due:
            self._turn_due = True
            self._loop.call_soon(self._next_turn)
        if self._reads < self.turn_reads and not self._waiting:
            self._reads += 1
            return False
        if not conn.waiting:
            conn.waiting = True
            self._waiting.append(conn)
        return True

    def _next_turn(self) -> None:
        """A new turn of the loop: parse the reads that waited, oldest first, up to the
        budget; those past it wait for the turn after."""
        self._turn_due = False
        self._reads = 0
        waiting = self._waiting
        while waiting and self._reads < self.turn_reads:
            conn = waiting.popleft()
            conn.waiting = False
            self._reads += 1
            if not conn.closed:
                conn.pump()
        if self._reads:  # this turn's count is cleared at the next one
            self._turn_due = True
            self._loop.call_soon(self._next_turn)

    def _sweep(self) -> None:
        """Once a second: close connections idle past `keep_alive_s`; refuse with 408 a
        head that takes longer than `header_timeout_s` (however it trickles in); hand a
        slow quick-lane body to the ASGI reader; end lingering closes."""
        now = time.monotonic()
        for c in list(self.connections):
            if c.lingering is not None:
                if now > c.lingering:
                    c.close()
            elif c.header_timeout(now):
                c.refuse(408, slow_head(self))
            elif not c.busy and now - c.last_read > self.keep_alive_s:
                c.close()
            elif c.busy and now - c.last_read > 1.0:
                c.unquick()  # its body is slow: BodyReader's stall timeout applies
        if self._loop is not None:
            self._sweeper = self._loop.call_later(1.0, self._sweep)


def slow_head(server: HttpServer) -> str:
    """What a client whose request head took too long is told (408), by either server."""
    return (f"the request's head took over {server.header_timeout_s} s "
            "(ingress.header_timeout_s); send it at once")


__all__ = ["READ_BUFFER_BYTES", "HttpServer", "claim_port", "slow_head"]

