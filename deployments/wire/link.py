"""A direct connection from a caller to an actor, frames on one stream instead of a
Ray call each: bundles and cancels from an ingress replica (or a `RaybatchClient`) to a
batching actor (`batcher.link`), batches from an engine to a replica actor that reads
ahead (`replicas.link`).

Why: one awaited Ray actor call costs far more CPU, the caller's and the actor's, than a
frame on a socket (`benchmarks.serve.ray_call`, `benchmarks.serve.transports`), and the
batching-actor path makes two a batch. What goes on it is what the Ray
call carried (`BatcherActor.infer`'s or `ModelReplica.run`'s arguments and answer,
pickled, protocol 5, its large tensors out of band: `deployments.wire.codec`), and the actor
runs the very same method; everything else
(readiness, stats, drain, stopping) stays a Ray call. How: the actor listens once asked
(`link_address`, a Ray call, which also hands out a random token): on a Unix socket for a
caller on its own node, on the node's address for one from another node
(`deployments.wire.endpoint`). The caller
connects (`deployments.wire.dialer`) and sends the token, then frames
`[length u32][call id u64][kind u8][payload]`: INFER (the call's arguments) is answered
by a REPLY (its value) or an ERROR (the exception it raised) with its id; CANCEL
(caller, keys) has no answer; PING is answered with a PONG at once
(`deployments.wire.keepalive`). One connection is read in order, so a
cancel sent after its bundle is seen after it, as with Ray calls. A sync actor (a
replica) serves on plain threads instead (`deployments.replica.link_server`), answering pings
however long a batch runs.
Failure: a connection that ends, or that the caller's heartbeat takes for lost (nothing
heard for `replicas.link_dead_s` while a call or a ping is open: a host that lost power
or is cut off sends no FIN), fails each call still open on it with `LinkLost` (the
caller asks Ray what became of a batching actor, `deployments.ingress.coalesce`, or takes it as
its replica's death, `deployments.replica.pool`); the actor cancels what a caller that went away
had open, as when a Ray call is cancelled. Trust: only a caller that got the token from
Ray (it holds the actor's handle) gets past the first bytes; a wrong token, none within
`TOKEN_WAIT_S`, a frame past `MAX_FRAME` or one that is not a call ends the connection.
"""

from __future__ import annotations

import asyncio
import fcntl
import hmac
import logging
import pickle
import secrets
import struct
import termios
import time
from collections.abc import Awaitable, Callable
from typing import Any

from batching.errors import WorkerDied
from batching.loop import detached_task
from deployments.wire.codec import KIND, OOB, decode, encode
from deployments.wire.endpoint import address_of, connect, listen_socket
from deployments.wire.keepalive import DEFAULT, Heartbeat, Keepalive, Verdict, tcp_keepalive

log = logging.getLogger(__name__)

HEAD = struct.Struct("<IQB")  # payload length, call id, kind
INFER, CANCEL, REPLY, ERROR, PING, PONG = 1, 2, 3, 4, 5, 6
TOKEN_BYTES = 16
TOKEN_WAIT_S = 5.0  # a connection that has not sent the token by then is closed
MAX_FRAME = 1 << 30  # a bundle of a batch of large tensors fits; a length past it is garbage
READ_BYTES = 1 << 18  # one read at most, into a connection's scratch buffer
BIG_FRAME = 1 << 17  # a frame with a payload this large is read into a buffer of its own


class LinkLost(WorkerDied):
    """The direct connection to an actor ended with this call open. `ray_said`: when Ray was
    asked about the actor before the connection was ended (`Link`'s `confirm`), its answer
    (the error its call raised, or `TimeoutError`)."""

    ray_said: BaseException | None = None


def _frame(cid: int, kind: int, payload: bytes) -> bytes:
    return HEAD.pack(len(payload), cid, kind) + payload


def _write(transport: Any, cid: int, kind: int, value: Any) -> None:
    """`value` as one frame of `kind` (pickled, its large tensors out of band, written as
    they lie: `writelines` of the parts)."""
    flag, parts = encode(value)
    head = HEAD.pack(sum(len(p) for p in parts), cid, kind | flag)
    if len(parts) == 1:
        transport.write(head + parts[0])
    else:
        transport.writelines([head + parts[0], *parts[1:]])


class _Framing(asyncio.BufferedProtocol):
    """Reads frames off a stream; `frame(cid, kind, payload)` gets each. The loop reads
    into this side's buffer (`get_buffer`): small frames into a scratch buffer, whence
    they are parsed as `data_received`; once the head of a frame of `BIG_FRAME` bytes or
    more has come, the rest of its payload is read straight into a buffer of its own, which
    becomes the payload (no copy: its arrays are made over it, `deployments.wire.codec`)."""

    transport: asyncio.Transport | None = None
    need_token: bytes | None = None  # the server: these bytes first, or the end

    def __init__(self) -> None:
        self.buf = bytearray()
        self._scratch = memoryview(bytearray(READ_BYTES))
        self._big: bytearray | None = None  # a large frame's payload, being read into
        self._big_have = 0
        self._big_head = (0, 0)  # its call id and kind

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._big is not None:
            return memoryview(self._big)[self._big_have:]
        return self._scratch

    def buffer_updated(self, nbytes: int) -> None:
        if self._big is None:
            self.data_received(self._scratch[:nbytes])
            return
        self._big_have += nbytes
        if self._big_have == len(self._big):
            payload, self._big = self._big, None
            self.frame(*self._big_head, payload)

    def data_received(self, data: bytes | memoryview) -> None:
        buf = self.buf
        buf += data
        if self.need_token is not None:
            if len(buf) < TOKEN_BYTES:
                return
            if not hmac.compare_digest(bytes(buf[:TOKEN_BYTES]), self.need_token):
                log.warning("a direct connection (deployments.wire.link) sent a wrong token; "
                            "closing it")
                self.transport.abort()
                return
            del buf[:TOKEN_BYTES]
            self.need_token = None
        at = 0
        while len(buf) - at >= HEAD.size:
            n, cid, kind = HEAD.unpack_from(buf, at)
            if n > MAX_FRAME:
                log.warning("a frame of %d bytes on a direct connection; closing it", n)
                self.transport.abort()
                return
            if len(buf) - at - HEAD.size < n:
                if n >= BIG_FRAME:  # the rest of it straight into a buffer of its own
                    self._big = bytearray(n)
                    have = self._big_have = len(buf) - at - HEAD.size
                    self._big[:have] = memoryview(buf)[at + HEAD.size:]
                    self._big_head = (cid, kind)
                    at = len(buf)
                break
            payload = buf[at + HEAD.size:at + HEAD.size + n]  # one copy, writable
            at += HEAD.size + n
            self.frame(cid, kind, payload)
            if self.transport.is_closing():  # that frame ended it: read no further
                return
        if at:
            del buf[:at]

    def frame(self, cid: int, kind: int, payload: bytes) -> None:
        raise NotImplementedError


class _Served(_Framing):
    """One caller's connection, at the actor."""

    def __init__(self, server: LinkServer) -> None:
        super().__init__()
        self.server = server
        self.need_token = server.token
        self.open: dict[int, asyncio.Task] = {}
        self.cancels: set[asyncio.Task] = set()
        self.no_token: asyncio.TimerHandle | None = None

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        tcp_keepalive(transport.get_extra_info("socket"), self.server.keepalive)
        self.no_token = asyncio.get_running_loop().call_later(TOKEN_WAIT_S, self._silent)

    def _silent(self) -> None:
        if self.need_token is not None:  # a connection that never says who it is
            self.transport.abort()

    def frame(self, cid: int, kind: int, payload: bytes) -> None:
        if kind == PING:  # answered here, on the loop, whatever runs: no work in it
            self.transport.write(_frame(cid, PONG, b""))
            return
        try:
            args = decode(payload, kind & OOB)
        except Exception:
            log.exception("an unreadable frame on a direct connection; closing it")
            self.transport.abort()
            return
        if type(args) is not tuple:
            log.warning("a frame of %s on a direct connection; closing it", type(args).__name__)
            self.transport.abort()
            return
        if kind & KIND == INFER:
            self._start(cid, self.server.infer(*args))
        elif kind & KIND == CANCEL:
            task = asyncio.get_running_loop().create_task(self.server.cancel(*args))
            self.cancels.add(task)
            task.add_done_callback(self.cancels.discard)
        else:
            self.transport.abort()

    def _start(self, cid: int, call: Awaitable[Any]) -> None:
        task = self.open[cid] = asyncio.get_running_loop().create_task(call)
        task.add_done_callback(lambda t, cid=cid: self._answer(cid, t))

    def _answer(self, cid: int, task: asyncio.Task) -> None:
        self.open.pop(cid, None)
        if task.cancelled() or self.transport is None or self.transport.is_closing():
            return
        error = task.exception()
        try:
            if error is None:
                _write(self.transport, cid, REPLY, task.result())
            else:
                _write(self.transport, cid, ERROR, error)
        except Exception as e:  # an answer that does not pickle: the call's error says so
            self.transport.write(_frame(cid, ERROR, pickle.dumps(
                WorkerDied(f"the answer could not be sent back: {e!r}"))))

    def connection_lost(self, exc: BaseException | None) -> None:
        if self.no_token is not None:
            self.no_token.cancel()
        self.server.connections.discard(self)
        for task in self.open.values():  # nobody waits: as a cancelled Ray call
            task.cancel()
        self.open.clear()


class LinkServer:
    """The actor's side: runs `infer(bundle, caller, sent)` and `cancel(caller, keys)` for
    each caller that connects with the token; answers pings; `keepalive`: its TCP
    keepalive (a caller that vanished ends its connection)."""

    def __init__(self, infer: Callable[..., Awaitable[Any]],
                 cancel: Callable[..., Awaitable[Any]],
                 keepalive: Keepalive = DEFAULT) -> None:
        self.infer, self.cancel = infer, cancel
        self.keepalive = keepalive
        self.token = secrets.token_bytes(TOKEN_BYTES)
        self.servers: dict[str, asyncio.AbstractServer] = {}
        self.connections: set[_Served] = set()

    async def address(self, host: str) -> tuple[str, int, bytes]:
        """Where a caller connects (listening on `host` from the first ask), and the token."""
        server = self.servers.get(host)
        if server is None:
            server = self.servers[host] = await asyncio.get_running_loop().create_server(
                self._connection, sock=listen_socket(host, 100))
        return *address_of(server.sockets[0]), self.token

    def _connection(self) -> _Served:
        conn = _Served(self)
        self.connections.add(conn)
        return conn

    def close(self) -> None:
        for server in self.servers.values():
            server.close()
        for conn in list(self.connections):
            if conn.transport is not None:
                conn.transport.abort()


class Link(_Framing):
    """The caller's side: `call` returns a future of the actor's answer; `cancel` sends.
    With `keepalive`, a heartbeat (`deployments.wire.keepalive`) takes a peer that stopped
    answering for lost; `on_lost(why)` is told when the connection ends other than by
    this side's `close` (the peer went away, or stopped answering). `confirm()`: asked
    before a silent peer is taken for lost, what Ray says of the actor: None (it lives:
    the connection is kept, and `spared` counts it) or the error that says otherwise."""

    def __init__(self, keepalive: Keepalive | None = None,
                 on_lost: Callable[[str], None] | None = None,
                 clock: Callable[[], float] = time.monotonic,
                 confirm: Callable[[], Awaitable[BaseException | None]] | None = None) -> None:
        super().__init__()
        self.open: dict[int, asyncio.Future] = {}
        self.next_id = 0
        self.closed = False
        self.keepalive, self.on_lost, self._clock = keepalive, on_lost, clock
        self.heartbeat: Heartbeat | None = None
        self._ticker: asyncio.TimerHandle | None = None
        self.confirm = confirm
        self._asking: asyncio.Task | None = None  # Ray being asked (confirm)
        self.spared = 0  # silences Ray said were not a lost actor

    @classmethod
    async def open_to(cls, host: str, port: int, token: bytes,
                      keepalive: Keepalive | None = None,
                      on_lost: Callable[[str], None] | None = None,
                      confirm: Callable[[], Awaitable[BaseException | None]] | None = None,
                      ) -> Link:
        _, link = await connect(lambda: cls(keepalive, on_lost, confirm=confirm), host, port)
        link.transport.write(token)
        return link

    def connection_made(self, transport: Any) -> None:
        super().connection_made(transport)
        if self.keepalive is not None:
            tcp_keepalive(transport.get_extra_info("socket"), self.keepalive)
            self.heartbeat = Heartbeat(self.keepalive, self._clock())
            self._tick()

    def buffer_updated(self, nbytes: int) -> None:
        if self.heartbeat is not None:
            self.heartbeat.heard_s = self._clock()
        super().buffer_updated(nbytes)

    def data_received(self, data: bytes | memoryview) -> None:
        if self.heartbeat is not None:
            self.heartbeat.heard_s = self._clock()
        super().data_received(data)

    # -- the heartbeat: one timer per connection, never one per call ----------------------
    def _tick(self) -> None:
        if not self.closed:
            self.check(self._clock())
        self._ticker = None if self.closed else asyncio.get_running_loop().call_later(
            self.keepalive.ping_s / 2, self._tick)

    def check(self, now: float) -> None:
        """The heartbeat's decision at `now`: ping, declare the connection lost, or wait."""
        verdict = self.heartbeat.check(now, bool(self.open),
                                       self.transport.get_write_buffer_size())
        if verdict is Verdict.PING:
            self.transport.write(_frame(0, PING, b""))
        elif verdict is not Verdict.LOST:
            return
        elif self._unread():  # the peer spoke; this side's loop was late to read it
            self.heartbeat.heard(now)
        elif self.confirm is None:
            self.lose(LinkLost(self.heartbeat.why(now)))
        elif self._asking is None:
            self._asking = detached_task(self._ask(now))

    async def _ask(self, since: float) -> None:
        """The heartbeat took the peer for lost at `since`: end the connection only if Ray
        does not say the actor lives on (or nothing was heard meanwhile)."""
        silence, why = self.heartbeat.silence(since), self.heartbeat.why(since)
        try:
            said = await self.confirm()
        except Exception as e:
            said = e
        finally:
            self._asking = None
        if self.closed:
            return
        now = self._clock()
        if said is None or self.heartbeat.heard_s > since:
            self.spared += 1
            log.warning("%s, but Ray says the actor lives on (busy, or starved for CPU): "
                        "the connection is kept", silence)
            self.heartbeat.answered(now)
            return
        error = LinkLost(f"{why}; Ray said: {type(said).__name__}: {said}")
        error.ray_said = said
        self.lose(error)

    def _unread(self) -> int:
        """Bytes in this side's receive queue, not yet read."""
        sock = self.transport.get_extra_info("socket") if self.transport else None
        if sock is None:
            return 0
        try:
            return struct.unpack("i", fcntl.ioctl(sock.fileno(), termios.FIONREAD, b"\0" * 4))[0]
        except (OSError, ValueError):  # closed, or not a socket this can ask
            return 0

    def lose(self, error: LinkLost) -> None:
        """End the connection from this side because the peer stopped answering: every
        open call fails with `error`, whatever comes later on it is never read."""
        if self.closed:
            return
        self.closed = True
        log.warning("a direct connection is lost: %s", error)
        self._fail_open(error)
        if self.on_lost is not None:
            self.on_lost(str(error))
        self.transport.abort()

    def call(self, *args: Any) -> asyncio.Future:
        """The future of the served function's answer to `args` (`infer` at a batching
        actor: bundle, caller, sent; `run` at a replica: the batch's items)."""
        fut = asyncio.get_running_loop().create_future()
        if self.closed:
            fut.set_exception(LinkLost("the connection was closed"))
            return fut
        self.next_id += 1
        self.open[self.next_id] = fut
        _write(self.transport, self.next_id, INFER, args)
        return fut

    def cancel(self, caller: str, keys: list[Any], *more: Any) -> None:
        """`more`: the model, at an actor that runs a group of them."""
        if not self.closed:
            self.transport.write(_frame(0, CANCEL, pickle.dumps((caller, keys, *more),
                                                                protocol=5)))

    def frame(self, cid: int, kind: int, payload: bytes) -> None:
        if kind == PONG:
            if self.heartbeat is not None:
                self.heartbeat.answered(self._clock())
            return
        fut = self.open.pop(cid, None)
        if fut is None or fut.done():
            return
        try:
            value = decode(payload, kind & OOB)
        except Exception as e:
            fut.set_exception(LinkLost(f"an unreadable answer: {e!r}"))
            return
        if kind & KIND == REPLY:
            fut.set_result(value)
        else:
            fut.set_exception(value if isinstance(value, BaseException) else LinkLost(
                f"the other end answered {value!r}"))

    def connection_lost(self, exc: BaseException | None) -> None:
        if self._ticker is not None:
            self._ticker.cancel()
        by_peer, self.closed = not self.closed, True
        why = LinkLost(f"the connection ended ({exc or 'closed'})")
        self._fail_open(why)
        if by_peer and self.on_lost is not None:
            self.on_lost(str(why))

    def _fail_open(self, error: LinkLost) -> None:
        for fut in self.open.values():
            if not fut.done():
                fut.set_exception(error)
        self.open.clear()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()

