"""The native front: Raybatch's HTTP server with its sockets on a native thread, and the
common infer request queued there and handed to the engine in blocks.

Why: the Python server (`deployments.http.pyserver.server`) spends its process's one GIL on every
request's bytes; Triton and mosec parse and queue on native threads and enter Python once
per batch, and served more on the same cores (`benchmarks.http.front`, `benchmarks.peers`).
`_front.c` (its note says how) owns every socket. What this module adds:

- **Plans learned from the Python server.** An infer request that the Python server's
  quick lane answered with 200 teaches the front a plan: its target and its JSON header
  (binary extension) or its JSON body with the data list emptied; from then on the front
  queues requests with those exact bytes itself (`deployments.http.native.blocks`). Only plans
  whose request the engine takes as plain items: one input, a batch dim, no priority,
  timeout or sequence parameters.
- **Blocks.** What the front queued is taken in one call per wake-up; each plan's
  requests become one engine request per block of at most the model's max batch size
  (their tensors are already one contiguous buffer), and the block's answer goes back in
  one call: every request gets the JSON the Python path would write (made once per
  block) and its own rows of each output. An error (a 429 at admission, a model error)
  is the same answer to each request of the block.
- **Requests handed over whole.** Any other request the front frames whole and the
  Python server would take as it is comes as one event and is answered by the Python
  server's rules, written back in the connection's order (`deployments.http.native.exchange`).
- **Python mode.** The odd rest (a large chunked body, bent requests, a slow body,
  `Expect`, `Upgrade`) is the Python server's to frame: the front hands such a connection's unparsed
  bytes, from the start of a request, to a `Connection` over a transport of the front's
  (`_Transport`), which reads and writes through the front's thread, for the rest of the
  connection's life. It never comes back: the Python server's parser may hold bytes of
  the next request at any moment, and a connection framed by one parser and then the
  other could be read two ways.

What a client sees is the same either way (tests/unit/deployments/http/test_front.py and
test_front_hostile.py send the same bytes through both): same bytes for the same
answers, same errors, same limits. What differs: a block's requests share its admission
decision (the engine still counts each request). A client that goes away with requests
queued: those still gathering are dropped, a block whose every client went away is
cancelled in the engine (what it has not started never runs), and a block with a client
left has the gone clients' rows withdrawn from what the engine still holds queued; what
of them already runs is dropped (`deployments.http.native.departures`).

The module is optional (`ingress.native_front`); where `_front` was not compiled the
Python server serves alone (`available()`).
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

from deployments.http.native.blocks import Blocks
from deployments.http.native.exchange import Exchanges
from deployments.http.oip.errors import Unavailable, error_parts
from deployments.http.pyserver.connection import Connection
from deployments.http.pyserver.cycle import Cycle, error_response
from deployments.http.pyserver.server import HttpServer, connection_room, slow_head
from deployments.protocol import error_body

try:
    from deployments.http.native import _front
except ImportError:  # not compiled (no C compiler at install): the Python server serves
    _front = None

log = logging.getLogger("deployments.http")

PARTIAL_S = 0.5  # a request arriving slower than this goes to the Python server


def available() -> bool:
    """Was the native front compiled (`make setup` with a C compiler)?"""
    return _front is not None


class _LearningCycle(Cycle):
    """A request of the Python server that may teach the front a plan once answered."""

    __slots__ = ("kept",)

    def __init__(self, *args: Any) -> None:
        super().__init__(*args)
        self.kept: bytes | None = None

    def whole_body(self) -> bytes:
        self.kept = body = super().whole_body()
        return body

    def respond(self, status: int, headers: list, parts: list) -> None:
        super().respond(status, headers, parts)
        if status == 200 and self.kept is not None:
            try:  # tried once per kind of request (`Blocks.learn` remembers it either way)
                self.conn.server.book.learn(self.scope, self.kept)
            except Exception:  # the answer is out; the Python server keeps this kind
                log.exception("the native front could not learn a plan for %s; the Python "
                              "server goes on serving these requests",
                              self.scope.get("path"))


class _Connection(Connection):
    """A connection in Python mode, for the rest of its life."""

    cycle_class = _LearningCycle


class _Transport(asyncio.Transport):
    """A Python-mode connection's transport: the front's thread does the I/O."""

    def __init__(self, server: FrontServer, cid: int, protocol: Connection) -> None:
        super().__init__()
        self.server, self.front, self.cid, self.protocol = server, server.front, cid, protocol
        self.closing = self.write_paused = False

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        if name in ("peername", "sockname"):
            found = self.front.addresses(self.cid)
            if found is not None:
                return found[0] if name == "peername" else found[1]
        return default

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        pass  # the front's mark: ingress.max_unsent_bytes, the same setting

    def write(self, data: Any) -> None:
        if self.closing or not data:
            return
        if self.front.send(self.cid, data) and not self.write_paused:
            self.write_paused = True
            self.protocol.pause_writing()

    def writelines(self, parts: Any) -> None:
        self.write(b"".join(parts))

    def drained(self) -> None:
        if self.write_paused:
            self.write_paused = False
            self.protocol.resume_writing()

    def can_write_eof(self) -> bool:
        return True

    def write_eof(self) -> None:
        self.front.control(self.cid, 2)

    def pause_reading(self) -> None:
        self.front.control(self.cid, 3)

    def resume_reading(self) -> None:
        self.front.control(self.cid, 4)

    def is_closing(self) -> bool:
        return self.closing

    def close(self) -> None:
        self._end(0)

    def abort(self) -> None:
        self._end(1)

    def _end(self, how: int) -> None:
        if not self.closing:
            self.closing = True
            self.front.control(self.cid, how)
            self.server.transports.pop(self.cid, None)
            self.server._loop.call_soon(self.protocol.connection_lost, None)


class FrontServer(HttpServer):
    """`HttpServer` with the native front (`deployments.http.native._front`) owning its sockets.
    `app`: the OIP app (`OipApp`: its ASGI entry, quick lane and engine are used), or any
    ASGI app (then every request is the Python server's, through the front's sockets)."""

    def __init__(self, app: Any, **kwargs: Any) -> None:
        if _front is None:
            raise RuntimeError("the native front was not compiled (no C compiler at "
                               "install): set ingress.native_front to false, or install "
                               "gcc and run `make setup` again")
        self.oip = app if hasattr(app, "quick") else None
        kwargs.pop("quick", None)
        super().__init__(app.direct if self.oip else app,
                         quick=self.oip.quick if self.oip else None, **kwargs)
        self.front: Any = None
        self.transports: dict[int, _Transport] = {}
        self.book = Blocks(self)  # plans learnt, blocks in flight
        self.exchanges = Exchanges(self)  # requests the front framed, answered here
        self.cycle_class = _LearningCycle
        self.accepting = True

    async def start(self) -> None:
        self._loop = loop = asyncio.get_running_loop()
        self.max_connections = connection_room(self.max_connections)
        sock = self._bind()
        try:
            sock.listen(2048)
            sock.setblocking(False)
            oip = self.oip
            count = oip.limits.max_header_count if oip else 100
            size = min(oip.limits.max_header_bytes, self.max_header_bytes) if oip else \
                self.max_header_bytes
            # a body up to the app's own limit is framed whole (past it, the Python server
            # words the 413); the app's body reader would hold as much of it anyway
            body = oip.body_reader.max_bytes if oip else 0
            status, busy, headers = error_parts(Unavailable(
                "this server holds its limit of connections (ingress.max_connections); "
                "retry shortly"))
            self.front = _front.Front(
                sock.fileno(), self.max_connections, self.max_pipelined, count, size, body,
                self.max_unsent_bytes,
                self.keep_alive_s, PARTIAL_S, error_response(status, busy, headers),
                self.header_timeout_s, error_response(408, error_body(slow_head(self))))
            self.exchanges.front = self.front
        finally:
            sock.close()  # the front holds its own descriptor
        loop.add_reader(self.front.fileno(), self._wake)
        self._sweeper = loop.call_later(1.0, self._sweep)

    def close(self) -> None:
        self.accepting = False
        self.book.release()  # what waited to fill a block goes now
        if self.front is not None:
            self.front.set(not (self.oip and self.oip.draining), False)
        super().close()

    async def stop(self, timeout_s: float) -> None:
        give_up = time.monotonic() + timeout_s
        self.close()
        while (self.book.pending or self.exchanges.pending) and time.monotonic() < give_up:
            await asyncio.sleep(0.05)
        await super().stop(max(0.0, give_up - time.monotonic()))
        if self.front is not None:
            self._loop.remove_reader(self.front.fileno())
            self.front.stop()
            self.front = None

    def stats(self) -> dict[str, int]:
        return self.front.stats() if self.front is not None else {}

    # -- what the front's thread has for Python ---------------------------------------------
    def _wake(self) -> None:
        front = self.front
        if front is None:
            return
        retiring, self.exchanges.retiring = self.exchanges.retiring, []
        events, arrivals, payloads = front.take()
        try:
            for kind, cid, flag, data in events:
                try:
                    self._event(kind, cid, flag, data)
                except Exception:  # one connection's failure ends that connection only
                    log.exception("the HTTP server failed on a connection; closing it")
                    front.control(cid, 1)
                    t = self.transports.pop(cid, None)
                    if t is not None:
                        t.closing = True
        finally:  # what was queued is answered whatever happened above
            if arrivals:
                self.book.queued(arrivals, payloads)
            self.exchanges.retire(retiring)

    def _event(self, kind: int, cid: int, flag: int, data: bytes) -> None:
        front = self.front
        if kind == _front.REQUEST:
            self.exchanges.arrived(cid, data)
        elif kind == _front.ADOPT:
            self._adopt(cid, data, flag)
        elif kind == _front.GONE:  # a client went away with requests queued
            self.exchanges.gone(cid)
            self.book.gone(int.from_bytes(data, "little"))
        else:
            t = self.transports.get(cid)
            if t is None:
                if kind == _front.DRAINED:  # a stream of a request event may go on
                    self.exchanges.drained(cid)
                elif kind == _front.EOF:  # ... or learns its client sends no more
                    self.exchanges.eof(cid)
                return
            if kind == _front.DATA:
                t.protocol.data_received(data)
                if not t.closing:
                    front.control(cid, 5)  # taken: the front reads the next
            elif kind == _front.EOF:
                if not t.protocol.eof_received():
                    t.close()
            elif kind == _front.LOST:
                self.transports.pop(cid, None)
                t.closing = True
                t.protocol.connection_lost(ConnectionResetError("the client went away"))
            elif kind == _front.DRAINED:
                t.drained()

    def _adopt(self, cid: int, data: bytes, eof: bool) -> None:
        conn = _Connection(self)
        t = self.transports[cid] = _Transport(self, cid, conn)
        conn.connection_made(t)
        if data:
            conn.data_received(data)
        if eof and not t.closing and not conn.eof_received():
            t.close()

__all__ = ["FrontServer", "available"]
