"""Requests the native front framed whole and hands to Python: each answered by the Python
server's rules and written back through the front, in its connection's order.

Why: a connection handed to the Python server (Python mode) is framed twice, by the
front's llhttp and by the Python server's, and every way two framings of one byte stream
can differ is a way for a client to be answered for a request it did not send. So a
request the front frames whole and the Python server would take as it is (the front's
`recognise` says which) stays the front's: its head and body come to Python as one event
(`REQUEST`), never its connection's bytes. What this module decides:

- **One `Cycle` per request, as the Python server runs it.** The request becomes the same
  ASGI scope (`request_scope`), goes through the same quick lane or ASGI app, and its answer
  is framed by the same `Cycle` (lengths, chunked streams, HEAD, a 500 for an app that
  fails): a client cannot tell which server answered.
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
from deployments.http.pyserver.cycle import error_response
from deployments.http.pyserver.framing import Refused
from deployments.protocol import error_body

_HEAD = struct.Struct("<Q8I")  # token, keep-alive, fields, method, target, body (offset, length)


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
    return (token, bool(keep & 1), "1.1" if keep >> 8 else "1.0",
            raw[mo:mo + ml].decode("ascii", "replace"), raw[uo:uo + ul], headers, raw[bo:bo + bl])


class Exchange:
    """One request and its answer: the connection (and transport) its `Cycle` sees."""

    __slots__ = ("closed", "cycle", "finished", "line", "loop", "request", "server", "token",
                 "transport")

    def __init__(self, line: _Line, token: int, request: tuple) -> None:
        self.line, self.token, self.server = line, token, line.book.server
        self.request = request  # what `begin` takes: keep-alive, version, method, ...
        self.loop = self.server._loop
        self.transport = self
        self.closed = False  # its client is gone (or the answer closed the connection)
        self.finished = False  # the front was told the answer is whole
        self.cycle: Any = None  # once begun

    @property
    def writable(self) -> asyncio.Event | None:
        return self.line.writable

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
            self._end(not cycle.keep_alive, data)
        elif self.line.book.front.write(self.token, data):
            self.line.pause()

    def done(self, cycle: Any) -> None:
        self._end(not cycle.keep_alive)
        self.line.next(self)

    def close(self) -> None:
        """The answer cannot be completed (the app failed or returned without one): the
        connection closes after what was written."""
        self.closed = True
        self._end(True)
        self.line.next(self)

    def resume_reading(self) -> None:
        pass  # the body is whole

    def _end(self, close: bool, data: bytes = b"") -> None:
        if not self.finished:
            self.finished = True
            if close:  # the connection ends with this answer: what follows never runs
                self.line.closing = True
            self.line.book.front.write(self.token, data, True, close)

    # -- the front's side -------------------------------------------------------------------
    def begin(self) -> None:
        keep, version, method, target, headers, body = self.request
        self.request = None
        server = self.server
        line = self.line
        cycle = self.cycle = server.cycle_class(self, None, keep)
        try:
            cycle.scope = request_scope(server, version, method, target, headers,
                                        line.client, line.local)
        except Exception as e:  # the front hands over only targets this reads; if not, said
            if isinstance(e, Refused):
                status, text, headers = e.status, error_body(str(e)), []
            else:
                status, text, headers = error_parts(e)
                log_error(e, status, method, target.decode("ascii", "replace"))
            cycle.answered = True
            self._end(True, error_response(status, text, headers))
            line.next(self)
            return
        if body:
            cycle.body.append(body)
            cycle.buffered = len(body)
        cycle.complete = True
        cycle.disconnected = line.eof  # the client half-closed: it may still read this
        # the quick lane takes a POST whose body is whole: here every body is (the Python
        # server's takes one within its read buffer, for the same reason)
        cycle.quick = server.quick is not None and method == "POST"
        cycle.start()

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
                 "writable")

    def __init__(self, book: Exchanges, cid: int) -> None:
        self.book, self.cid = book, cid
        self.queue: deque[Exchange] = deque()
        self.writable: asyncio.Event | None = None
        self.pumping = False
        self.closing = False  # an answer closes the connection: the rest are not run
        self.eof = False  # the client sends no more (its answers are still written)
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
        body is read: a stream ends), as the Python server's `eof_received` tells them."""
        self.eof = True
        for ex in self.queue:
            if ex.cycle is not None:
                ex.cycle.disconnected = True
                ex.cycle.wake()

    def gone(self) -> None:
        self.book.lines.pop(self.cid, None)
        queue, self.queue = self.queue, deque()
        for ex in queue:
            ex.gone()
        self.drained()  # a stream waiting to write ends (it finds its client gone)


class Exchanges:
    """The requests of every connection in Python's hands (`FrontServer.exchanges`)."""

    def __init__(self, server: Any) -> None:
        self.server = server
        self.front: Any = None  # set once the front is made
        self.lines: dict[int, _Line] = {}
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

    def arrived(self, cid: int, data: bytes) -> None:
        token, *request = parse_event(data)
        line = self.lines.get(cid)
        if line is None:
            line = self.lines[cid] = _Line(self, cid)
        line.queue.append(Exchange(line, token, tuple(request)))
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
