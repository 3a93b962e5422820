"""Raybatch's own HTTP/1.1 server: the OIP app on a port of each ingress replica.

Why: under Serve's direct ingress, uvicorn answers each request through its
ASGI cycle, two socket writes, a keep-alive timer reset and its middlewares: on
these machines 50 us of CPU per request for an app that answers `{}`, and 39% of
an ingress replica's samples serving `mlp` (`benchmarks.profile_ingress`). This
server does what the OIP app needs and no more: httptools parses, one small
`Cycle` per request carries the ASGI `receive`/`send`, and a response goes out
in ONE write when its length is known (status line, headers and body; a
zero-copy response's parts in one `writelines`); streams (SSE) go out chunked,
one write per event. Keep-alive idleness is checked by one sweep a second for all
connections, not a timer per request.

What it keeps of a proper server: pipelined requests are answered in order, one
at a time; a request body is buffered up to `READ_BUFFER_BYTES`, past which the
socket stops being read until the app takes it (so a client cannot grow memory,
and `BodyReader` still refuses a large body at the piece that crosses the limit);
`Expect: 100-continue` is answered when the app first asks for the body; an
`Upgrade` (WebSocket, h2c) is ignored (answered in HTTP/1.1, then closed); a client's
end of input (FIN) still gets the answers to what it sent whole; request
lines and headers past `max_header_bytes` get 431 (a URL past it 414) before the
app sees them; unparsable input gets 400 and the connection closes; a client that
goes away wakes the app's `receive` with `http.disconnect` (SSE generations end);
writes wait while the client's socket buffer is full; an app error before the
response starts is a 500 `{"error"}`, after it the connection closes. Connections
idle (or sending headers) longer than `keep_alive_s` are closed.

The quick lane: a POST whose whole body fits the read buffer may be taken by the
app's `quick` (`OipApp.quick`: infer requests) once its body is whole, and answered
from the engine's callback with `Cycle.respond`: no task, no coroutine, no ASGI
message per request, the costs left after the server's own (a throwaway probe of a
bare protocol answering `{}` cost 10 us a request against this server's 31-49 us
with the ASGI cycle). Anything else, or a body still arriving after the next
one-second sweep (so `BodyReader`'s stall timeout still applies), goes through the
ASGI app as before; pipelined requests keep their order across both.

`SO_REUSEPORT`: every ingress replica of a node binds the same port and the
kernel spreads connections across them, as Serve's own proxies do. The kernel
would as gladly spread them across two different apps of the same user, giving
one app's clients the other's answers: `claim_port` refuses that (a small file per
port, per node, names the app whose live processes hold it). The request/response
cycle (ASGI `receive`/`send`, framing) is `deployments.http.cycle`.
"""

from __future__ import annotations

import asyncio
import logging
import socket
import time
from collections import deque
from typing import Any
from urllib.parse import unquote

import httptools

from deployments.http.cycle import READ_BUFFER_BYTES, Cycle, error_response
from deployments.http.portclaim import claim_port
from deployments.protocol import error_body

log = logging.getLogger("deployments.http")

MAX_PIPELINED = 16  # requests parsed ahead of the one being answered


class HttpServer:
    """Serves `app` (an ASGI callable) on `host:port` from the running loop.

    >>> server = HttpServer(app.direct, host="0.0.0.0", port=8080)   # doctest: +SKIP
    >>> await server.start(); ...; await server.stop(10)             # doctest: +SKIP
    """

    def __init__(self, app: Any, *, host: str = "127.0.0.1", port: int = 0,
                 reuse_port: bool = True, keep_alive_s: float = 75.0,
                 max_header_bytes: int = 16 * 2**10, route_prefix: str = "/",
                 owner: str | None = None, quick: Any = None) -> None:
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
        self.connections: set[_Connection] = set()
        self._server: asyncio.AbstractServer | None = None
        self._sweeper: asyncio.TimerHandle | None = None
        self._loop: asyncio.AbstractEventLoop | None = None

    async def start(self) -> None:
        """Bind and listen; `port` 0 takes a free port (read `self.port` after)."""
        self._loop = loop = asyncio.get_running_loop()
        if self.reuse_port and self.port and self.owner is not None:
            claim_port(self.port, self.owner)
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
        self._server = await loop.create_server(lambda: _Connection(self), sock=sock,
                                                backlog=2048)
        self._sweeper = loop.call_later(1.0, self._sweep)

    def close(self) -> None:
        """Stop accepting; requests in progress go on (see `stop`)."""
        if self._server is not None:
            self._server.close()
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

    def _sweep(self) -> None:
        """Close connections idle, or stuck sending headers, past `keep_alive_s`."""
        now = time.monotonic()
        for c in list(self.connections):
            if not c.busy and now - c.last_read > self.keep_alive_s:
                c.close()
            elif c.busy and now - c.last_read > 1.0:
                c.unquick()  # its body is slow: BodyReader's stall timeout applies
        if self._loop is not None:
            self._sweeper = self._loop.call_later(1.0, self._sweep)


class _Connection(asyncio.Protocol):
    """One client connection: the parser, the queue of requests, the write gate."""

    def __init__(self, server: HttpServer) -> None:
        self.server = server
        self.loop = server._loop
        self.parser = httptools.HttpRequestParser(self)
        self.transport: Any = None
        self.client: tuple[str, int] | None = None
        self.local: tuple[str, int] | None = None
        self.cycles: deque[Cycle] = deque()  # [0] is being answered; the rest wait
        self.parsing: Cycle | None = None  # the request whose body is arriving
        self.url = b""
        self.headers: list[tuple[bytes, bytes]] = []
        self.header_bytes = 0
        self.last_read = time.monotonic()
        self.paused_reading = False
        self.writable: asyncio.Event | None = None  # set while the socket takes writes
        self.closed = False
        self.eof = False  # the client will send nothing more

    @property
    def busy(self) -> bool:
        return bool(self.cycles)

    # -- asyncio.Protocol ---------------------------------------------------------------
    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.client = _address(transport.get_extra_info("peername"))
        self.local = _address(transport.get_extra_info("sockname"))
        self.server.connections.add(self)

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.server.connections.discard(self)
        for cycle in self.cycles:
            cycle.disconnected = True
            cycle.wake()
            if cycle.on_gone is not None:  # a quick-lane request: nobody waits for it now
                gone, cycle.on_gone = cycle.on_gone, None
                gone()
        if self.writable is not None:
            self.writable.set()

    def data_received(self, data: bytes) -> None:
        self.last_read = time.monotonic()
        try:
            self.parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            # Answered as plain HTTP/1.1 (a server may ignore Upgrade), then closed: the
            # parser reads nothing after an upgrade request.
            if self.cycles:
                self.cycles[-1].keep_alive = False
                self._pause_reading()
            else:
                self._reject(400, "protocol upgrades (WebSocket, h2c) are not served here")
        except httptools.HttpParserError as e:
            why = e.__context__  # a callback's own exception (httptools wraps it)
            if isinstance(why, _Refused):
                self._reject(why.status, str(why))
            else:
                if why is not None:
                    log.error("HTTP parser callback failed", exc_info=why)
                self._reject(400, f"malformed HTTP request: {e}; send HTTP/1.1")

    def eof_received(self) -> bool | None:
        """The client sent all it will (a close, or a half-close after its requests):
        what it sent whole is still answered, then the connection closes; a request cut
        short learns the client is gone (`http.disconnect`). A client that really went
        away is noticed at the next write (an event stream's next event)."""
        self.eof = True
        if not self.cycles:
            return None  # nothing to answer: close now
        for cycle in self.cycles:
            if not cycle.complete:
                cycle.disconnected = True
                cycle.wake()
        self.unquick()  # a quick request cut short: the app learns it through ASGI
        return True  # keep our side open for the answers

    def pause_writing(self) -> None:
        if self.writable is None:
            self.writable = asyncio.Event()
        self.writable.clear()

    def resume_writing(self) -> None:
        if self.writable is not None:
            self.writable.set()

    # -- httptools callbacks --------------------------------------------------------------
    def on_message_begin(self) -> None:
        self.url, self.headers, self.header_bytes = b"", [], 0

    def on_url(self, url: bytes) -> None:
        self.url += url
        if len(self.url) > self.server.max_header_bytes:
            raise _Refused(414, f"the request URL is over {self.server.max_header_bytes} bytes")

    def on_header(self, name: bytes, value: bytes) -> None:
        self.header_bytes += len(name) + len(value)
        if self.header_bytes > self.server.max_header_bytes:
            raise _Refused(431, f"the request headers are over {self.server.max_header_bytes}"
                                " bytes (ingress.max_header_bytes); send fewer or smaller")
        self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        parser = self.parser
        url = httptools.parse_url(self.url)
        raw_path = url.path
        path = raw_path.decode("ascii", "replace")
        if "%" in path:
            path = unquote(path)
        version = parser.get_http_version()
        scope = {
            "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
            "http_version": version, "server": self.local, "client": self.client,
            "scheme": "http", "method": parser.get_method().decode("ascii", "replace"),
            "root_path": self.server.root_path, "path": path, "raw_path": raw_path,
            "query_string": url.query or b"", "headers": self.headers,
        }
        cycle = Cycle(self, scope, parser.should_keep_alive())
        length = None
        for name, value in self.headers:
            if name == b"content-length":
                length = value
            elif name == b"transfer-encoding" or (
                    name == b"expect" and value.lower() == b"100-continue"):
                length = b"x"  # chunked, or waiting to be told to send: not quick
                cycle.expect_100 = cycle.expect_100 or name == b"expect"
        # The quick lane takes a POST whose whole body fits the read buffer, once read.
        cycle.quick = (self.server.quick is not None and scope["method"] == "POST"
                       and length is not None and length.isdigit()
                       and int(length) <= READ_BUFFER_BYTES)
        self.parsing = cycle
        self.cycles.append(cycle)
        if len(self.cycles) == 1:
            cycle.start()
        elif len(self.cycles) > MAX_PIPELINED:
            self._pause_reading()

    def on_body(self, body: bytes) -> None:
        cycle = self.parsing
        if cycle is None or cycle.answered:
            return  # the app answered without reading it: dropped, the connection closes
        cycle.body.append(body)
        cycle.buffered += len(body)
        if cycle.buffered > READ_BUFFER_BYTES:
            self._pause_reading()
        cycle.wake()

    def on_message_complete(self) -> None:
        cycle = self.parsing
        self.parsing = None
        if cycle is not None:
            cycle.complete = True
            if cycle.quick and self.cycles and self.cycles[0] is cycle:
                cycle.start()  # its body is whole: the quick lane may take it now
            else:
                cycle.wake()

    # -- helpers --------------------------------------------------------------------------
    def unquick(self) -> None:
        """The first request waits for its body to be whole before the quick lane sees
        it; when that body is slow or cut short, the ASGI app reads it instead."""
        if self.cycles:
            cycle = self.cycles[0]
            if cycle.quick and not cycle.started:
                cycle.quick = False
                cycle.start()

    def _pause_reading(self) -> None:
        if not self.paused_reading and not self.closed:
            self.paused_reading = True
            self.transport.pause_reading()

    def resume_reading(self) -> None:
        if self.paused_reading and not self.closed:
            self.paused_reading = False
            self.transport.resume_reading()

    def _reject(self, status: int, message: str) -> None:
        """Unparsable or oversized input: answer it (if nothing is being answered) and
        close; what the client sent after it cannot be trusted."""
        if not self.closed:
            if not self.cycles or not self.cycles[0].started:
                self.transport.write(error_response(status, error_body(message)))
            self.close()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.transport.close()

    def done(self, cycle: Cycle) -> None:
        """`cycle`'s response is complete: answer the next request, or close."""
        if self.cycles and self.cycles[0] is cycle:
            self.cycles.popleft()
        if not (cycle.keep_alive and cycle.complete) or self.closed or (
                self.eof and not self.cycles):
            self.close()  # asked to, an unread body in the way, or nothing more will come
            return
        if self.cycles:
            self.cycles[0].start()
        if self.paused_reading and len(self.cycles) <= MAX_PIPELINED and not any(
                c.buffered > READ_BUFFER_BYTES for c in self.cycles):
            self.resume_reading()


class _Refused(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


__all__ = ["READ_BUFFER_BYTES", "HttpServer", "claim_port"]


def _address(addr: Any) -> tuple[str, int] | None:
    if isinstance(addr, tuple) and len(addr) >= 2:
        return str(addr[0]), int(addr[1])
    return None
