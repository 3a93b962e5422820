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
- **Every other request handed over framed.** The front frames every request on its
  connections, once, with the Python server's parser (llhttp); Python never sees a
  connection's bytes. Any other request comes as one event (its body whole, or streamed as
  it arrives: `Expect`, a head the framing checks must pass first, a large or slow body),
  input the parser refuses as a refusal event, and each is answered by the Python server's
  rules, written back in the connection's order (`deployments.http.native.exchange`).

What a client sees is the same from either server (test_front.py, test_front_requests.py
and the differential fuzzer in tests/unit/deployments/http send the same bytes to both):
same bytes for the same answers, same errors, same limits. What differs: a block's
requests share its admission decision (the engine still counts each request). A client
that goes away with requests queued: those still gathering are dropped, a block whose
every client went away is cancelled in the engine (what it has not started never runs),
and a block with a client left has the gone clients' rows withdrawn from what the engine
still holds queued; what of them already runs is dropped
(`deployments.http.native.departures`).

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
from deployments.http.pyserver.cycle import Cycle, error_response
from deployments.http.pyserver.server import HttpServer, connection_room, slow_head
from deployments.protocol import error_body

try:
    from deployments.http.native import _front
except ImportError:  # not compiled (no C compiler at install): the Python server serves
    _front = None

log = logging.getLogger("deployments.http")

PARTIAL_S = 0.5  # a body arriving slower than this is streamed to the app as it comes


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
            self.exchanges.max_header_bytes = size
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
                    front.abort(cid)
        finally:  # what was queued is answered whatever happened above
            if arrivals:
                self.book.queued(arrivals, payloads)
            self.exchanges.start()
            self.exchanges.retire(retiring)

    def _event(self, kind: int, cid: int, flag: int, data: bytes) -> None:
        exchanges = self.exchanges
        if kind == _front.REQUEST:
            exchanges.arrived(cid, data, bool(flag))
        elif kind == _front.BODY:  # a part of a streamed request's body
            exchanges.body(cid, data, bool(flag))
        elif kind == _front.REFUSED:
            exchanges.refused(cid, data)
        elif kind == _front.GONE:  # a client went away with requests queued
            exchanges.gone(cid)
            self.book.gone(int.from_bytes(data, "little"))
        elif kind == _front.DRAINED:  # a stream of an answer may go on
            exchanges.drained(cid)
        elif kind == _front.EOF:  # ... or learns its client sends no more
            exchanges.eof(cid)


__all__ = ["FrontServer", "available"]
