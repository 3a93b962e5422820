"""The replica's side of a direct connection (`deployments.wire.link`): plain threads and
blocking sockets, the batch run on the thread that read it.

Why: a replica is a sync actor whose work is the batch. The connection's reader thread
reads a frame and, with one call slot (a CPU replica: its work would compete with the
model for its cores), runs the batch itself and writes its answer: no hand-off to another
thread and back: two wake-ups a batch, a cost a small machine's cores felt when an event
loop read the frames and a pool ran them (docs/performance.md). With more slots (a replica
that reads ahead) the reader hands each call to a pool and reads the next at once; the
pool's thread writes the answer.

Pings: while its reader runs a batch inline, a connection cannot read the caller's
pings, so a pulse thread (one per server, waking every `ping_s / 2`) writes a PONG on each
connection busy with a batch: the caller's heartbeat hears it as alive however long a
batch runs, and a host that dies or is cut off stops the pulses with everything else.
Frames, token, limits and answers are `deployments.wire.link`'s (large tensors out of band:
`deployments.wire.codec`, a frame's parts written with one `sendmsg`, and an array read
made over the frame's own buffer); writes are whole frames under the connection's lock.
"""

from __future__ import annotations

import hmac
import logging
import pickle
import secrets
import socket
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from batching.errors import WorkerDied
from deployments.wire.codec import KIND, OOB, decode, encode
from deployments.wire.endpoint import address_of, listen_socket, no_delay
from deployments.wire.keepalive import DEFAULT, Keepalive, tcp_keepalive
from deployments.wire.link import (
    CANCEL,
    ERROR,
    HEAD,
    INFER,
    MAX_FRAME,
    PING,
    PONG,
    REPLY,
    TOKEN_BYTES,
    TOKEN_WAIT_S,
)

log = logging.getLogger(__name__)

READ_BYTES = 1 << 18  # one recv at most; a larger frame's payload is read into its own buffer


class _Gone(Exception):
    """The connection ended (by the caller, an error, or this side's close)."""


class _Served:
    """One caller's connection: its socket, the write lock, and whether a batch runs inline."""

    def __init__(self, server: ThreadedLinkServer, sock: socket.socket) -> None:
        self.server, self.sock = server, sock
        self.write_lock = threading.Lock()
        self.busy = False  # the reader runs a batch: the pulse answers for it
        self.closed = False
        self.buf = bytearray()

    def send(self, cid: int, kind: int, *parts: bytes | memoryview) -> None:
        """One frame of `parts`, whole, or nothing once the connection has ended."""
        views = [memoryview(HEAD.pack(sum(len(p) for p in parts), cid, kind)),
                 *(memoryview(p) for p in parts if len(p))]
        with self.write_lock:
            if self.closed:
                return
            try:
                while views:  # a short write: the rest, still under the lock
                    sent = self.sock.sendmsg(views)
                    while views and sent >= len(views[0]):
                        sent -= len(views.pop(0))
                    if views:
                        views[0] = views[0][sent:]
            except OSError:
                self.close()

    def close(self) -> None:
        if self.closed:
            return
        self.closed = True
        try:
            self.sock.shutdown(socket.SHUT_RDWR)  # wakes a recv blocked on another thread
        except OSError:
            pass
        self.sock.close()

    # -- reading ------------------------------------------------------------------------
    def _recv(self) -> None:
        try:
            data = self.sock.recv(READ_BYTES)
        except OSError:
            raise _Gone from None
        if not data:
            raise _Gone
        self.buf += data

    def _exactly(self, n: int) -> bytearray:
        """The next `n` bytes: from the buffer, then straight off the socket."""
        buf = self.buf
        if len(buf) >= n:
            out = buf[:n]  # one copy, writable: arrays decoded from it are made over it
            del buf[:n]
            return out
        out = bytearray(n)
        have = len(buf)
        out[:have] = buf
        buf.clear()
        view = memoryview(out)
        while have < n:
            try:
                got = self.sock.recv_into(view[have:])
            except OSError:
                raise _Gone from None
            if not got:
                raise _Gone
            have += got
        return out

    def token_ok(self) -> bool:
        self.sock.settimeout(TOKEN_WAIT_S)
        try:
            token = self._exactly(TOKEN_BYTES)
        except (_Gone, TimeoutError):
            return False
        self.sock.settimeout(None)
        if not hmac.compare_digest(bytes(token), self.server.token):
            log.warning("a direct connection (deployments.wire.link) sent a wrong token; "
                        "closing it")
            return False
        return True

    def serve(self) -> None:
        """Read frames until the connection ends; ends it on anything that is not a call."""
        server = self.server
        while True:
            while len(self.buf) < HEAD.size:
                self._recv()
            n, cid, kind = HEAD.unpack_from(self.buf)
            if n > MAX_FRAME:
                log.warning("a frame of %d bytes on a direct connection; closing it", n)
                return
            del self.buf[:HEAD.size]
            payload = self._exactly(n)
            oob, kind = kind & OOB, kind & KIND
            if kind == PING:
                self.send(cid, PONG)
            elif kind == CANCEL:
                pass  # a batch sent to a replica runs: its caller drops what it gave up on
            elif kind != INFER:
                return
            elif server.pool is None:
                self.busy = True
                try:
                    kind, parts = server.run(payload, oob)
                finally:
                    self.busy = False
                if kind is None:
                    return
                self.send(cid, kind, *parts)
            else:
                server.pool.submit(self._run_on_pool, cid, payload, oob)

    def _run_on_pool(self, cid: int, payload: bytearray, oob: int) -> None:
        kind, parts = self.server.run(payload, oob)
        if kind is None:
            self.close()
        else:
            self.send(cid, kind, *parts)


class ThreadedLinkServer:
    """The actor's side of a direct connection for a sync actor (a model replica): calls
    `fn(*args)` for each INFER frame and answers it. `workers`: call slots; with one, each
    batch runs on its connection's reader thread, one at a time, in order; with more, on
    a pool of that many threads while the reader reads ahead. `initializer` runs first on
    every thread that runs calls (a replica pins them to its cores). `on_ended` runs when
    a caller's connection that sent the token ends while the server is open (a replica
    then asks whether it is still wanted: `deployments.replica.wanted`)."""

    def __init__(self, fn: Callable[..., Any], workers: int,
                 initializer: Callable[[], None] | None = None,
                 keepalive: Keepalive = DEFAULT,
                 on_ended: Callable[[], None] | None = None) -> None:
        self.fn, self.initializer, self.keepalive = fn, initializer, keepalive
        self.on_ended = on_ended
        self.calls = 0  # calls served
        self.token = secrets.token_bytes(TOKEN_BYTES)
        self.pool = (ThreadPoolExecutor(workers, thread_name_prefix="link-call",
                                        initializer=initializer) if workers > 1 else None)
        self.listeners: dict[str, socket.socket] = {}
        self.connections: set[_Served] = set()
        self.lock = threading.Lock()
        self.closed = threading.Event()
        self._pulse: threading.Thread | None = None

    def address(self, host: str) -> tuple[str, int, bytes]:
        """Where a caller connects (listening on `host` from the first ask), and the token."""
        with self.lock:
            sock = self.listeners.get(host)
            if sock is None:
                sock = self.listeners[host] = listen_socket(host)
                threading.Thread(target=self._accept, args=(sock,), name="link-accept",
                                 daemon=True).start()
            if self._pulse is None:
                self._pulse = threading.Thread(target=self._pulses, name="link-pulse",
                                               daemon=True)
                self._pulse.start()
        return *address_of(sock), self.token

    def run(self, payload: bytearray, oob: int = 0) -> tuple[int | None, list[Any]]:
        self.calls += 1
        return run_frame(self.fn, payload, oob)

    def close(self) -> None:
        """Stop listening and end every connection (as the actor's death would)."""
        self.closed.set()
        with self.lock:
            listeners, self.listeners = list(self.listeners.values()), {}
            connections = list(self.connections)
        for sock in listeners:
            try:
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()
        for conn in connections:
            conn.close()

    # -- threads --------------------------------------------------------------------------
    def _accept(self, listener: socket.socket) -> None:
        while not self.closed.is_set():
            try:
                sock, _ = listener.accept()
            except OSError:
                return  # closed
            no_delay(sock)
            tcp_keepalive(sock, self.keepalive)
            conn = _Served(self, sock)
            with self.lock:
                if self.closed.is_set():
                    conn.close()
                    return
                self.connections.add(conn)
            threading.Thread(target=self._serve, args=(conn,), name="link",
                             daemon=True).start()

    def _serve(self, conn: _Served) -> None:
        caller = False  # sent the token: an engine, not a stray or hostile connection
        try:
            if self.initializer is not None and self.pool is None:
                self.initializer()  # this thread runs the batches
            if conn.token_ok():
                caller = True
                conn.serve()
        except _Gone:
            pass
        except Exception:
            log.exception("a direct connection failed; closing it")
        finally:
            conn.close()
            with self.lock:
                self.connections.discard(conn)
            if caller and self.on_ended is not None and not self.closed.is_set():
                self.on_ended()

    def _pulses(self) -> None:
        while not self.closed.wait(self.keepalive.ping_s / 2):
            with self.lock:
                busy = [c for c in self.connections if c.busy]
            for conn in busy:
                conn.send(0, PONG)


def run_frame(fn: Callable[..., Any], payload: bytes | bytearray,
              oob: int = 0) -> tuple[int | None, list[Any]]:
    """A call's arguments from `payload` (`oob`: its frame's kind had `OOB`), `fn(*args)`,
    and its answer as (REPLY or ERROR, with `OOB` where it has out-of-band buffers; the
    payload's parts); (None, []) for a frame that is not a call's arguments."""
    try:
        args = decode(payload, oob)
    except Exception:
        log.exception("an unreadable frame on a direct connection; closing it")
        return None, []
    if type(args) is not tuple:
        return None, []
    try:
        value, kind = fn(*args), REPLY
    except BaseException as e:  # the call's error, sent back as a Ray call's would be
        value, kind = e, ERROR
    try:
        flag, parts = encode(value)
        return kind | flag, parts
    except Exception as e:  # an answer that does not pickle: the call's error says so
        return ERROR, [pickle.dumps(WorkerDied(f"the answer could not be sent back: {e!r}"))]


__all__ = ["ThreadedLinkServer"]
