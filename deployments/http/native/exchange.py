"""Requests the native front framed and hands to Python: each answered by the Python
server's rules and written back through the front, in its connection's order.

Why: a connection framed by two parsers (the front's llhttp, then the Python server's) can
be read two ways, and every way two framings of one byte stream can differ is a way for a
client to be answered for a request it did not send. So the front frames every request on
its connections and Python never sees a connection's bytes, only requests: a whole one as
one event (`REQUEST`), a streamed one (Expect, a head the framing checks must pass before
its body is read, a body past the front's bounds or a slow one) as its head (`REQUEST`,
streamed) then its body as it comes (`BODY`), and input refused as it was read (`REFUSED`).
What this module decides:

- **One `Cycle` per request, as the Python server runs it.** The request becomes the same
  ASGI scope (`request_scope`), its head passes the same checks (`framing`), it goes through
  the same quick lane or ASGI app, and its answer is framed by the same `Cycle` (lengths,
  chunked streams, HEAD, a 500 for an app that fails); refusals are worded by the same
  `refusal`: a client cannot tell which server answered.
- **A streamed body is read as the app takes it**: the front holds it until the head's
  checks pass (a refused head's body is never read), then reads ahead of the app by at most
  its read buffer, and reads on as the app takes it (`Front.more`), as the Python server's
  parser runs ahead of its app.
- **One request at a time per connection**, as the Python server answers pipelined
  requests: the next of a connection starts once the one before it is answered (its order
  of effects is the client's order). Its answer's bytes go to the front (`Front.write`),
  which writes them in the connection's order, after the answers the front queued itself.
- **Every request ends once at the front**, answered or not: its last write (or an empty
  one) tells the front the answer is whole, or, for a client gone, that nothing more comes,
  so a closed connection's slot is freed (the front holds it while answers are owed).
- **A stream waits for its client**: a write past `ingress.max_unsent_bytes` holds the app
  until the front says the connection drained (`DRAINED`), as a transport's pause would.
- **A client gone** (`GONE`, its connection closed with requests owed): the request under
  way learns it (`http.disconnect`; the quick lane's cancels it in the engine), and those
  not started never run.
"""

from __future__ import annotations

import asyncio
import struct
from collections import deque
from typing import Any

from deployments.http.oip.errors import error_parts, log_error
from deployments.http.pyserver.connection import request_scope
from deployments.http.pyserver.cycle import READ_BUFFER_BYTES, error_response
from deployments.http.pyserver.framing import Refused, framing, refusal
from deployments.protocol import error_body

_HEAD = struct.Struct("<Q8I")  # token, keep-alive, fields, method, target, body (offset, length)
_REFUSED = struct.Struct("<QI")  # token, what


def parse_event(data: bytes) -> tuple[int, bool, str, str, bytes, list[tuple[bytes, bytes]],
                                      bytes]:
    """A REQUEST event's (token, keep-alive, HTTP version, method, target, headers, body):
    headers as the Python server keeps them (names lowercased, values as sent)."""
    token, keep, nf, mo, ml, uo, ul, bo, bl = _HEAD.unpack_from(data)
    start = _HEAD.size + 16 * nf
    raw = data[start:]
    spans = struct.unpack_from(f"<{4 * nf}I", data, _HEAD.size)
    headers = [(raw[spans[i]:spans[i] + spans[i + 1]].lower(),
                raw[spans[i + 2]:spans[i + 2] + spans[i + 3]]) for i in range(0, 4 * nf, 4)]
    return (token, bool(keep & 1), f"{(keep >> 16) & 0xff}.{(keep >> 8) & 0xff}",
            raw[mo:mo + ml].decode("ascii", "replace"), raw[uo:uo + ul], headers, raw[bo:bo + bl])


def _refusal_bytes(e: Exception, method: str, target: bytes) -> bytes:
    """The whole answer (it closes the connection) to a request refused before it ran."""
    if isinstance(e, Refused):
        return error_response(e.status, error_body(str(e)))
    status, text, headers = error_parts(e)
    log_error(e, status, method, target.decode("ascii", "replace"))
    return error_response(status, text, headers)


class Exchange:
    """One request and its answer: the connection (and transport) its `Cycle` sees."""

    __slots__ = ("body", "closed", "complete", "cycle", "expect", "finished", "keep", "line",
                 "loop", "quick", "refusal", "scope", "server", "token", "transport", "unacked")

    def __init__(self, line: _Line, token: int, keep: bool) -> None:
        self.line, self.token, self.keep, self.server = line, token, keep, line.book.server
        self.loop = self.server._loop
        self.transport = self
        self.closed = False  # its client is gone (or the answer closed the connection)
        self.finished = False  # the front was told the answer is whole
        self.cycle: Any = None  # once begun
        self.scope: dict | None = None
        self.refusal: bytes | None = None  # its answer, if it is refused before it runs
        self.body: list[bytes] = []  # what of its body came before it began
        self.complete = True  # its body is whole (a streamed one: once its last part came)
        self.expect = self.quick = False
        self.unacked = 0  # body bytes the front handed over that its app has not taken

    @property
    def writable(self) -> asyncio.Event | None:
        return self.line.writable

    def prepare(self, version: str, method: str, target: bytes,
                headers: list[tuple[bytes, bytes]], body: bytes, streamed: bool) -> None:
        """Check its head as the Python server checks it as it arrives: a refusal is its
        answer (and a streamed body is then never read); else a streamed body may come."""
        server, line = self.server, self.line
        try:
            if streamed:  # the front frames only plain heads whole
                expect, length, chunked = framing(version, method, headers)
            self.scope = request_scope(server, version, method, target, headers,
                                       line.client, line.local)
        except Exception as e:
            self.refusal = _refusal_bytes(e, method, target)
            return
        quick = server.quick is not None and method == "POST"
        if not streamed:
            if body:
                self.body.append(body)
            self.quick = quick  # every body here is whole
            return
        self.complete = False
        self.expect = expect and version == "1.1"  # never a 1xx to an HTTP/1.0 client
        # the quick lane takes a body within the read buffer, once whole (as the Python
        # server's)
        self.quick = (quick and not expect and not chunked and length is not None
                      and length <= READ_BUFFER_BYTES)
        line.book.front.more(self.token, 0)  # the head passed: its body may be read

    # -- what the Cycle calls on its connection and transport -------------------------------
    def write(self, data: bytes) -> None:
        self._put(data)

    def writelines(self, parts: Any) -> None:
        self._put(b"".join(parts))

    def _put(self, data: bytes) -> None:
        if self.finished:
            return
        cycle = self.cycle
        if cycle is not None and cycle.answered:  # the answer's last bytes
            self._end(not (cycle.keep_alive and cycle.complete), data)
        elif self.line.book.front.write(self.token, data):
            self.line.pause()

    def done(self, cycle: Any) -> None:
        # asked to close, or a body left unread: the connection ends after this answer
        self._end(not (cycle.keep_alive and cycle.complete))
        self.line.next(self)

    def close(self) -> None:
        """The answer cannot be completed (the app failed or returned without one): the
        connection closes after what was written."""
        self.closed = True
        self._end(True)
        self.line.next(self)

    def resume_reading(self) -> None:
        """Its app took what was buffered of the body: the front may read on."""
        cycle = self.cycle
        taken = self.unacked - (cycle.buffered if cycle is not None else 0)
        if taken > 0 and not self.finished:
            self.unacked -= taken
            self.line.book.front.more(self.token, taken)

    def _end(self, close: bool, data: bytes = b"") -> None:
        if not self.finished:
            self.finished = True
            if close:  # the connection ends with this answer: what follows never runs
                self.line.closing = True
            self.line.book.front.write(self.token, data, True, close)

    # -- the front's side -------------------------------------------------------------------
    def begin(self) -> None:
        if self.refusal is not None:
            self._end(True, self.refusal)
            self.line.next(self)
            return
        cycle = self.cycle = self.server.cycle_class(self, self.scope, self.keep)
        cycle.body, self.body = self.body, []
        cycle.buffered = sum(map(len, cycle.body))
        cycle.complete = self.complete
        cycle.expect_100 = self.expect
        cycle.disconnected = self.line.eof  # the client half-closed: it may still read this
        # a body cut short (the client sends no more) goes to the app, never the quick lane
        cycle.quick = self.quick and (self.complete or not self.line.eof)
        cycle.start()

    def feed(self, data: bytes, last: bool) -> None:
        """A part of its streamed body (`last`: the body is whole)."""
        self.unacked += len(data)
        cycle = self.cycle
        if cycle is None:
            if data:
                self.body.append(data)
            self.complete = self.complete or last
            return
        if cycle.answered:
            return  # answered without reading it: the connection closes after the answer
        if data:
            cycle.body.append(data)
            cycle.buffered += len(data)
        if last:
            cycle.complete = True
            if cycle.quick and not cycle.started:
                cycle.start()  # whole: the quick lane may take it now
                return
        cycle.wake()

    def cut(self, answer: bytes) -> None:
        """Its streamed body was refused where the front read it (`answer`, the refusal):
        an app reading it learns the client is gone; else the refusal is its answer."""
        cycle = self.cycle
        if cycle is not None and cycle.started:
            cycle.disconnected = True
            cycle.keep_alive = False
            cycle.wake()
            return
        self.refusal = answer
        if cycle is not None:  # begun, waiting for its body to be whole
            cycle.answered = True
            cycle.quick = False
            self._end(True, answer)
            self.line.next(self)

    def gone(self) -> None:
        """Its client went away: the app learns it; the front is told nothing more comes."""
        self.closed = True
        cycle = self.cycle
        if cycle is not None:
            cycle.disconnected = True
            cycle.wake()
            if cycle.on_gone is not None:
                gone, cycle.on_gone = cycle.on_gone, None
                gone()
        self._end(False)


class _Line:
    """One connection's requests in Python's hands, oldest first; [0] is being answered."""

    __slots__ = ("book", "cid", "client", "closing", "eof", "local", "pumping", "queue",
                 "streaming", "writable")

    def __init__(self, book: Exchanges, cid: int) -> None:
        self.book, self.cid = book, cid
        self.queue: deque[Exchange] = deque()
        self.writable: asyncio.Event | None = None
        self.pumping = False
        self.closing = False  # an answer closes the connection: the rest are not run
        self.eof = False  # the client sends no more (its answers are still written)
        self.streaming: Exchange | None = None  # the request whose body is arriving
        found = book.front.addresses(cid)
        self.client, self.local = found if found is not None else (None, None)

    def pump(self) -> None:
        """Start the oldest request if none is under way (no recursion: a request answered
        at once only lets the loop go round)."""
        if self.pumping:
            return
        self.pumping = True
        try:
            while self.queue and self.queue[0].cycle is None:
                ex = self.queue[0]
                if self.closing:  # after an answer that closes: never run, never written
                    ex.gone()
                    self.next(ex)
                else:
                    ex.begin()
        finally:
            self.pumping = False

    def next(self, ex: Exchange) -> None:
        if self.queue and self.queue[0] is ex:
            self.queue.popleft()
            if not self.queue:
                self.book.idle(self)
            self.pump()

    def pause(self) -> None:
        if self.writable is None:
            self.writable = asyncio.Event()
        self.writable.clear()

    def drained(self) -> None:
        if self.writable is not None:
            self.writable.set()

    def ended_input(self) -> None:
        """The client sends no more: every request learns it (`http.disconnect` once its
        body is read: a stream ends), as the Python server's `eof_received` tells them; one
        waiting for its body to be whole for the quick lane goes to the app instead."""
        self.eof = True
        for ex in self.queue:
            if ex.cycle is not None:
                ex.cycle.disconnected = True
                ex.cycle.wake()
        first = self.queue[0].cycle if self.queue else None
        if first is not None and first.quick and not first.started:
            first.quick = False
            first.start()

    def gone(self) -> None:
        self.book.lines.pop(self.cid, None)
        queue, self.queue = self.queue, deque()
        self.streaming = None
        for ex in queue:
            ex.gone()
        self.drained()  # a stream waiting to write ends (it finds its client gone)


class Exchanges:
    """The requests of every connection in Python's hands (`FrontServer.exchanges`)."""

    def __init__(self, server: Any) -> None:
        self.server = server
        self.front: Any = None  # set once the front is made
        self.max_header_bytes = 0  # the front's, set with it (refusals say it)
        self.lines: dict[int, _Line] = {}
        self.arriving: dict[int, _Line] = {}  # lines with requests new in this take
        self.retiring: list[_Line] = []  # idle closing lines, forgotten after the next take

    def idle(self, line: _Line) -> None:
        """`line` has nothing in Python's hands: forgotten, unless an answer closed its
        connection. Then it is kept until the front's events of before that answer are
        taken (`retire`): a request framed just before it, not yet taken, must find the
        line closing and not run."""
        if line.closing:
            self.retiring.append(line)
        elif self.lines.get(line.cid) is line:
            del self.lines[line.cid]

    def retire(self, lines: list[_Line]) -> None:
        """After a take: the closing lines idle before it are forgotten."""
        for line in lines:
            if not line.queue and self.lines.get(line.cid) is line:
                del self.lines[line.cid]

    @property
    def pending(self) -> int:
        return sum(len(line.queue) for line in self.lines.values())

    def _line(self, cid: int) -> _Line:
        line = self.lines.get(cid)
        if line is None:
            line = self.lines[cid] = _Line(self, cid)
        return line

    def arrived(self, cid: int, data: bytes, streamed: bool) -> None:
        token, keep, *request = parse_event(data)
        line = self._line(cid)
        ex = Exchange(line, token, keep)
        line.queue.append(ex)
        if not line.closing:  # else never run (`pump`), nor its body read
            ex.prepare(*request, streamed)
        if streamed:
            line.streaming = ex
        self.arriving[cid] = line

    def body(self, cid: int, data: bytes, last: bool) -> None:
        line = self.lines.get(cid)
        ex = line.streaming if line is not None else None
        if ex is not None:
            if last:
                line.streaming = None
            ex.feed(data, last)

    def refused(self, cid: int, data: bytes) -> None:
        """Input refused as the front read it: a head (an answer in its turn) or the rest
        of a streamed body (that request is cut there)."""
        token, what = _REFUSED.unpack_from(data)
        reason = data[_REFUSED.size:].decode("latin-1")
        e = refusal(what, self.max_header_bytes, reason)
        answer = error_response(e.status, error_body(str(e)))
        line = self._line(cid)
        ex = line.streaming
        if ex is not None and ex.token == token:
            line.streaming = None
            ex.cut(answer)
            return
        ex = Exchange(line, token, False)
        ex.refusal = answer
        line.queue.append(ex)
        self.arriving[cid] = line

    def start(self) -> None:
        """After a take: the requests it brought may start. Not before: as the Python
        server parses what a read brought before it starts a request, a request whose
        streamed body the front refused in the same read is answered with the refusal,
        never started."""
        arriving, self.arriving = self.arriving, {}
        for line in arriving.values():
            line.pump()

    def gone(self, cid: int) -> None:
        line = self.lines.get(cid)
        if line is not None:
            line.gone()

    def eof(self, cid: int) -> None:
        line = self.lines.get(cid)
        if line is not None:
            line.ended_input()

    def drained(self, cid: int) -> None:
        line = self.lines.get(cid)
        if line is not None:
            line.drained()


__all__ = ["Exchange", "Exchanges", "parse_event"]
