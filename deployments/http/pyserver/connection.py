"""One client connection of `deployments.http.pyserver.server`: parsing, pipelining, flow control,
and every decision about what a hostile or broken client may make the server hold.

httptools (llhttp, Node.js's parser, strict mode) frames requests; this class decides
what to do with them. It holds to these rules:

- **Bounded input.** Bytes are parsed in slices (`FIRST_SLICE`, `SLICE`, past a request
  body of known length) and parsing stops while `max_pipelined` requests wait ahead of the one being
  answered, while a request body fills the read buffer, or while the client does not
  read its answers (unsent output over `max_unsent_bytes`). Whatever arrived and is not
  parsed stays as raw bytes (one socket read at most) and the socket is not read.
  A request's head (request line and headers) is counted as it is fed, whether its lines
  end or not: past its limit, 431 (414 for the URL alone).
- **Strict framing** (RFC 9112): HTTP/1.0 and 1.1 only (505); exactly one Host in
  HTTP/1.1, at most one in 1.0 (400); Transfer-Encoding only `chunked`, only in 1.1, never
  beside Content-Length (501 for other codings, 400 otherwise); trailer fields read and
  dropped, never merged into the headers; `Expect: 100-continue` honoured for HTTP/1.1 only
  (other expectations 417); CONNECT refused (405); a target `parse_url` cannot read, 400.
- **No answer lost.** A request that was read whole is answered even when what follows
  it is garbage, oversized or cut off: the error goes out after the answers before it,
  then the connection closes. After a request with `Connection: close` nothing more is
  read. An error close lingers: the server stops writing (FIN), reads and drops what the
  client still sends for up to `LINGER_S`, then closes, so the client reads the error
  instead of a reset.
- **No recursion.** Requests answered at once (the quick lane's errors) are started by one
  loop (`pump`), however many a client pipelines.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import deque
from typing import Any
from urllib.parse import unquote

import httptools

from deployments.http.pyserver.cycle import READ_BUFFER_BYTES, Cycle, error_response
from deployments.http.pyserver.framing import (
    HEAD_TOO_LONG,
    HEADERS_TOO_LONG,
    MALFORMED,
    URL_TOO_LONG,
    Refused,
    framing,
    refusal,
    shown,
)
from deployments.protocol import error_body

log = logging.getLogger("deployments.http")

FIRST_SLICE = 4096  # bytes parsed at a time while no request waits to be answered
SLICE = 1024  # ... and while some do; both past a request body of known length
LINGER_S = 2.0  # how long an error close reads and drops what the client still sends
LINGER_BYTES = 4 * 2**20  # ... and how much of it


class Connection:
    """One client connection: the parser, the queue of requests, the write gate."""

    cycle_class = Cycle  # what carries each request (the native front's learns from it)

    def __init__(self, server: Any) -> None:
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
        self.in_head = True  # between requests or reading a head (not a body)
        self.head_fed = 0  # bytes fed while in the current head
        self.head_since: float | None = None  # when the current head's first byte came
        self.body_left: int | None = None  # of a body with a Content-Length
        self.inbuf: memoryview | bytes = b""  # received, not parsed yet
        self.last_read = time.monotonic()
        self.paused_reading = False
        self.write_paused = False
        self.writable: Any = None  # an asyncio.Event, set while the socket takes writes
        self.closed = False
        self.eof = False  # the client will send nothing more
        self.no_more = False  # parse nothing more (a close was asked, or input was refused)
        self.rejection: tuple[int, str] | None = None  # answered after what came before it
        self.lingering: float | None = None  # when the lingering close gives up
        self.dropped = 0  # bytes read and dropped while lingering
        self.pumping = self.repump = self.in_feed = False
        self.waiting = False  # its read waits for the loop's next turn (the server's)
        self.refusal: Refused | None = None  # raised by a parser callback (`_feed`)

    @property
    def busy(self) -> bool:
        return bool(self.cycles)

    # -- asyncio.Protocol ---------------------------------------------------------------
    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        self.client = _address(transport.get_extra_info("peername"))
        self.local = _address(transport.get_extra_info("sockname"))
        transport.set_write_buffer_limits(high=self.server.max_unsent_bytes)
        self.server.admit(self)

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
        if self.lingering is not None or self.no_more:
            self.dropped += len(data)  # after a close was asked or input was refused
            if self.dropped > LINGER_BYTES:
                self.close()
            return
        self.inbuf = memoryview(data) if not self.inbuf else bytes(self.inbuf) + data
        if self.server.turn_spent(self):  # parsed at the loop's next turn
            if len(self.inbuf) > READ_BUFFER_BYTES:
                self._flow()  # past a buffer's worth, the socket is not read meanwhile
            return
        self.pump()

    def eof_received(self) -> bool | None:
        """The client sent all it will (a close, or a half-close after its requests):
        what it sent whole is still answered, then the connection closes. Every request
        learns the client is gone (`http.disconnect`) once its body is read, as nginx and
        uvicorn take an end of input: what waits on it (a generation, an event stream)
        ends instead of running for a client that closed; an infer answer is still
        written, for a client that only half-closed."""
        self.eof = True
        if self.lingering is not None:
            self.close()
            return None
        self.pump()  # parse what is buffered first: it may hold whole requests
        if self.closed:
            return None
        if not self.cycles and self.rejection is None and not self.inbuf:
            return None  # nothing to answer: close now
        for cycle in self.cycles:
            cycle.disconnected = True
            cycle.wake()
        self.unquick()  # a quick request cut short: the app learns it through ASGI
        return True  # keep our side open for the answers

    def pause_writing(self) -> None:
        self.write_paused = True
        if self.writable is None:
            self.writable = asyncio.Event()
        self.writable.clear()

    def resume_writing(self) -> None:
        self.write_paused = False
        if self.writable is not None:
            self.writable.set()
        self.pump()

    # -- the one loop that starts requests and parses input -------------------------------
    def pump(self) -> None:
        """Start the first request if it may start, parse more input while there is room,
        send a pending rejection once what came before it is answered. Re-entrant calls
        (a request answered at once calls `done`, which calls this) only ask the running
        loop to go round again: no recursion however many requests are pipelined."""
        if self.pumping:
            self.repump = True
            return
        self.pumping = True
        try:
            while not self.closed:
                self.repump = False
                if self.cycles:
                    first = self.cycles[0]
                    if not first.started and not self.write_paused:
                        first.start()  # may answer (and pop) at once: then round again
                elif self.rejection is not None:
                    self._send_rejection()
                    return
                if self.inbuf and not self.in_feed:
                    self._parse()
                if not self.repump:
                    break
        finally:
            self.pumping = False
        self._flow()

    def _room(self) -> bool:
        """May more input be parsed now?"""
        if self.no_more or self.write_paused or len(self.cycles) > self.server.max_pipelined:
            return False
        parsing = self.parsing
        return parsing is None or parsing.buffered <= READ_BUFFER_BYTES

    def _parse(self) -> None:
        self.in_feed = True
        try:
            while self.inbuf and not self.closed and self._room():
                n = SLICE if self.cycles else FIRST_SLICE
                if not self.in_head and self.body_left:
                    n += self.body_left
                piece, self.inbuf = self.inbuf[:n], self.inbuf[n:]
                if self.in_head:
                    if self.head_since is None:
                        self.head_since = time.monotonic()
                    self.head_fed += len(piece)
                    if self.head_fed > self.server.max_head_bytes:
                        self._refuse(refusal(HEAD_TOO_LONG, self.server.max_header_bytes))
                        return
                self._feed(piece)
            if self.no_more:
                self.inbuf = b""
        finally:
            self.in_feed = False

    def _feed(self, piece: Any) -> None:
        try:
            self.parser.feed_data(piece)
        except httptools.HttpParserUpgrade:
            # Answered as plain HTTP/1.1 (a server may ignore Upgrade), then closed: the
            # parser reads nothing after an upgrade request.
            if self.cycles:
                self.cycles[-1].keep_alive = False
                self.no_more = True
            else:
                self.refuse(400, "protocol upgrades (WebSocket, h2c) are not served here")
        except httptools.HttpParserError as e:
            # a callback's own exception: httptools sets it as the error's context, but a
            # feed from inside an exception handler (an app's error answered, the next
            # request parsed) has that handled exception put there instead; so our own
            # refusals are kept here as they are raised
            why, self.refusal = self.refusal or e.__context__, None
            if isinstance(why, Refused):
                self.refuse(why.status, str(why))
            elif self.no_more:
                pass  # bytes after a request that asked to close: dropped (RFC 9112 9.6)
            else:
                if why is not None:
                    log.error("HTTP parser callback failed", exc_info=why)
                self._refuse(refusal(MALFORMED, self.server.max_header_bytes, str(e)))

    def _flow(self) -> None:
        """Read the socket only while what is read can be parsed."""
        if self.closed or self.lingering is not None:
            return
        if self.inbuf or self.write_paused:
            if not self.paused_reading:
                self.paused_reading = True
                self.transport.pause_reading()
        elif self.paused_reading:
            self.paused_reading = False
            self.transport.resume_reading()

    # -- httptools callbacks --------------------------------------------------------------
    def on_message_begin(self) -> None:
        self.url, self.headers, self.header_bytes = b"", [], 0
        self.in_head = True

    def on_url(self, url: bytes) -> None:
        self.url += url
        if len(self.url) > self.server.max_header_bytes:
            raise self._refused(refusal(URL_TOO_LONG, self.server.max_header_bytes))

    def on_header(self, name: bytes, value: bytes) -> None:
        self.header_bytes += len(name) + len(value)
        if self.header_bytes > self.server.max_header_bytes:
            raise self._refused(refusal(HEADERS_TOO_LONG, self.server.max_header_bytes))
        if self.in_head:  # a chunked body's trailer fields are counted, never used
            self.headers.append((name.lower(), value))

    def on_headers_complete(self) -> None:
        try:
            self._head_complete()
        except Refused as e:
            self.refusal = e
            raise

    def _refused(self, refused: Refused) -> Refused:
        self.refusal = refused
        return refused

    def _refuse(self, refused: Refused) -> None:
        self.refuse(refused.status, str(refused))

    def _head_complete(self) -> None:
        parser = self.parser
        version = parser.get_http_version()
        method = parser.get_method().decode("ascii", "replace")
        headers = self.headers
        cycle = self.cycle_class(self, None, parser.should_keep_alive())
        expect, length, chunked = framing(version, method, headers)
        if expect and version == "1.1":
            cycle.expect_100 = True  # never a 1xx to an HTTP/1.0 client (RFC 9110 15.2)
        cycle.scope = request_scope(self.server, version, method, self.url, headers,
                                    self.client, self.local)
        # The quick lane takes a POST whose whole body fits the read buffer, once read.
        cycle.quick = (self.server.quick is not None and method == "POST" and not expect
                       and not chunked and length is not None and length <= READ_BUFFER_BYTES)
        self.in_head, self.head_fed, self.head_since = False, 0, None
        self.body_left = length
        self.parsing = cycle
        self.cycles.append(cycle)
        self.repump = True  # `pump` (parsing this) starts it if it is first

    def on_body(self, body: bytes) -> None:
        if self.body_left is not None:
            self.body_left -= len(body)
        cycle = self.parsing
        if cycle is None or cycle.answered:
            return  # the app answered without reading it: dropped, the connection closes
        cycle.body.append(body)
        cycle.buffered += len(body)
        cycle.wake()

    def on_message_complete(self) -> None:
        cycle = self.parsing
        self.parsing, self.body_left, self.in_head = None, None, True
        self.head_fed, self.head_since = 0, None
        if cycle is not None:
            cycle.complete = True
            if not cycle.keep_alive:
                self.no_more = True  # Connection: close (or HTTP/1.0): nothing after it
            if cycle.quick:
                self.repump = True  # its body is whole: the quick lane may take it now
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
                self.pump()

    def resume_reading(self) -> None:
        """The app took a piece of a body: there may be room to parse and read again."""
        self.pump()

    def header_timeout(self, now: float) -> bool:
        """Is a request head arriving slower than `header_timeout_s` allows?"""
        return self.head_since is not None and now - self.head_since > self.server.header_timeout_s

    def refuse(self, status: int, message: str) -> None:
        """Input that cannot be served: nothing after it is parsed; the requests read
        whole before it are answered first, then this error, then the connection closes.
        A request cut short by it is dropped (or, if the app is reading its body, told the
        client is gone)."""
        self.no_more, self.inbuf = True, b""
        if self.rejection is not None or self.closed:
            return
        self.rejection = (status, message)
        cut = self.parsing
        if cut is not None and not cut.complete:
            self.parsing = None
            if cut.started:  # the app reads its body: it learns the client is gone
                cut.disconnected = True
                cut.keep_alive = False
                cut.wake()
            elif self.cycles and self.cycles[-1] is cut:
                self.cycles.pop()
        self.pump()

    def _send_rejection(self) -> None:
        if self.lingering is not None:
            return  # an answer before it closed the connection: the client hears no more
        status, message = self.rejection
        self.transport.write(error_response(status, error_body(message)))
        self.linger()

    def linger(self) -> None:
        """Close after an error: stop writing (FIN), then read and drop what the client
        still sends for up to LINGER_S before the socket closes, so that unread input
        does not turn the close into a reset that destroys the error on its way."""
        if self.closed or self.lingering is not None:
            return
        self.no_more = True
        self.lingering = time.monotonic() + LINGER_S
        try:
            if self.transport.can_write_eof():
                self.transport.write_eof()
        except (OSError, RuntimeError):
            self.close()
            return
        if self.eof:
            self.close()
        elif self.paused_reading:
            self.paused_reading = False
            self.transport.resume_reading()

    def close(self) -> None:
        if not self.closed:
            self.closed = True
            self.transport.close()

    def done(self, cycle: Cycle) -> None:
        """`cycle`'s response is complete: answer the next request, or close."""
        if self.cycles and self.cycles[0] is cycle:
            self.cycles.popleft()
        if self.closed:
            return
        if not (cycle.keep_alive and cycle.complete):
            # Asked to close, or a body left unread: what the client still sends is
            # dropped for a moment so the answer is read, not reset.
            self.linger()
            return
        if self.eof and not self.cycles and self.rejection is None and not self.inbuf:
            self.close()  # nothing more will come
            return
        self.pump()


def request_scope(server: Any, version: str, method: str, target: bytes,
                  headers: list[tuple[bytes, bytes]], client: Any, local: Any) -> dict:
    """The ASGI scope of a request (its head framed and checked), or `Refused` (400) for a
    target that is not a URL path: one reading of a request whichever server framed it."""
    try:
        url = httptools.parse_url(target)
    except httptools.HttpParserInvalidURLError:
        raise Refused(400, f"the request target {shown(target)} is not a URL path; "
                           "send an origin-form target such as /v2/models/NAME/infer"
                      ) from None
    raw_path = url.path or b"/"
    path = raw_path.decode("ascii", "replace")
    if "%" in path:
        path = unquote(path)
    return {
        "type": "http", "asgi": {"version": "3.0", "spec_version": "2.3"},
        "http_version": version, "server": local, "client": client,
        "scheme": "http", "method": method, "root_path": server.root_path,
        "path": path, "raw_path": raw_path, "query_string": url.query or b"",
        "headers": headers,
    }


def _address(addr: Any) -> tuple[str, int] | None:
    if isinstance(addr, tuple) and len(addr) >= 2:
        return str(addr[0]), int(addr[1])
    return None
