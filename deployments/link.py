"""A direct connection from a caller to an actor, frames on one TCP stream instead of a
Ray call each: bundles and cancels from an ingress replica (or a `RaybatchClient`) to a
batching actor (`batcher.link`), batches from an engine to a replica actor that reads
ahead (`replicas.link`).

Why: one awaited Ray actor call costs about 0.6 ms of the caller's CPU and 0.7 ms of the
actor's on 2 cores (`benchmarks.serve.ray_call`), and the batching-actor path makes two a
batch; a frame on a socket costs tens of microseconds. What goes on it is what the Ray
call carried (`BatcherActor.infer`'s or `ModelReplica.run`'s arguments and answer,
pickled, protocol 5), and the actor runs the very same method; everything else
(readiness, stats, drain, stopping) stays a Ray call. How: the actor listens once asked
(`link_address`, a Ray call, which also hands out a random token): on 127.0.0.1 for a
caller on its own node, on the node's address for one from another node. The caller
connects and sends the token, then frames `[length u32][call id u64][kind u8][payload]`:
INFER (the call's arguments) is answered by a REPLY (its value) or an ERROR (the
exception it raised) with its id; CANCEL (caller, keys) has no answer. One connection is
read in order, so a cancel sent after its bundle is seen after it, as with Ray calls.
A sync actor (a replica) serves from a loop on a thread of its own (`ThreadedLinkServer`).
Failure: a connection that ends fails each call still open on it with `LinkLost` (the
caller asks Ray what became of a batching actor, `deployments.coalesce`, or takes it as
its replica's death, `deployments.pool`); the actor cancels what a caller that went away
had open, as when a Ray call is cancelled. Trust: only a caller that got the token from
Ray (it holds the actor's handle) gets past the first bytes; a wrong token, none within
`TOKEN_WAIT_S`, a frame past `MAX_FRAME` or one that is not a call ends the connection.
"""

from __future__ import annotations

import asyncio
import hmac
import logging
import pickle
import secrets
import struct
import threading
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from batching.errors import WorkerDied
from batching.loop import detached_task
from deployments.transit import node_id

log = logging.getLogger(__name__)

HEAD = struct.Struct("<IQB")  # payload length, call id, kind
INFER, CANCEL, REPLY, ERROR = 1, 2, 3, 4
TOKEN_BYTES = 16
TOKEN_WAIT_S = 5.0  # a connection that has not sent the token by then is closed
MAX_FRAME = 1 << 30  # a bundle of a batch of large tensors fits; a length past it is garbage
RETRY_S = 10.0  # after a connection could not be opened, Ray calls until then


class LinkLost(WorkerDied):
    """The direct connection to an actor ended with this call open."""


def _frame(cid: int, kind: int, payload: bytes) -> bytes:
    return HEAD.pack(len(payload), cid, kind) + payload


class _Framing(asyncio.Protocol):
    """Reads frames off a stream; `frame(cid, kind, payload)` gets each."""

    transport: asyncio.Transport | None = None
    need_token: bytes | None = None  # the server: these bytes first, or the end

    def __init__(self) -> None:
        self.buf = bytearray()

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        if self.need_token is not None:
            if len(buf) < TOKEN_BYTES:
                return
            if not hmac.compare_digest(bytes(buf[:TOKEN_BYTES]), self.need_token):
                log.warning("a direct connection (deployments.link) sent a wrong token; "
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
                break
            payload = bytes(buf[at + HEAD.size:at + HEAD.size + n])
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
        self.no_token = asyncio.get_running_loop().call_later(TOKEN_WAIT_S, self._silent)

    def _silent(self) -> None:
        if self.need_token is not None:  # a connection that never says who it is
            self.transport.abort()

    def frame(self, cid: int, kind: int, payload: bytes) -> None:
        try:
            args = pickle.loads(payload)
        except Exception:
            log.exception("an unreadable frame on a direct connection; closing it")
            self.transport.abort()
            return
        if type(args) is not tuple:
            log.warning("a frame of %s on a direct connection; closing it", type(args).__name__)
            self.transport.abort()
            return
        loop = asyncio.get_running_loop()
        if kind == INFER:
            task = self.open[cid] = loop.create_task(self.server.infer(*args))
            task.add_done_callback(lambda t, cid=cid: self._answer(cid, t))
        elif kind == CANCEL:
            task = loop.create_task(self.server.cancel(*args))
            self.cancels.add(task)
            task.add_done_callback(self.cancels.discard)
        else:
            self.transport.abort()

    def _answer(self, cid: int, task: asyncio.Task) -> None:
        self.open.pop(cid, None)
        if task.cancelled() or self.transport is None or self.transport.is_closing():
            return
        error = task.exception()
        try:
            frame = (_frame(cid, REPLY, pickle.dumps(task.result(), protocol=5))
                     if error is None else _frame(cid, ERROR, pickle.dumps(error, protocol=5)))
        except Exception as e:  # an answer that does not pickle: the call's error says so
            frame = _frame(cid, ERROR, pickle.dumps(
                WorkerDied(f"the answer could not be sent back: {e!r}")))
        self.transport.write(frame)

    def connection_lost(self, exc: BaseException | None) -> None:
        if self.no_token is not None:
            self.no_token.cancel()
        self.server.connections.discard(self)
        for task in self.open.values():  # nobody waits: as a cancelled Ray call
            task.cancel()
        self.open.clear()


class LinkServer:
    """The actor's side: runs `infer(bundle, caller, sent)` and `cancel(caller, keys)` for
    each caller that connects with the token."""

    def __init__(self, infer: Callable[..., Awaitable[Any]],
                 cancel: Callable[..., Awaitable[Any]]) -> None:
        self.infer, self.cancel = infer, cancel
        self.token = secrets.token_bytes(TOKEN_BYTES)
        self.servers: dict[str, asyncio.AbstractServer] = {}
        self.connections: set[_Served] = set()

    async def address(self, host: str) -> tuple[str, int, bytes]:
        """Where a caller connects (listening on `host` from the first ask), and the token."""
        server = self.servers.get(host)
        if server is None:
            server = self.servers[host] = await asyncio.get_running_loop().create_server(
                self._connection, host, 0)
        return host, server.sockets[0].getsockname()[1], self.token

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
    """The caller's side: `call` returns a future of the actor's answer; `cancel` sends."""

    def __init__(self) -> None:
        super().__init__()
        self.open: dict[int, asyncio.Future] = {}
        self.next_id = 0
        self.closed = False

    @classmethod
    async def open_to(cls, host: str, port: int, token: bytes) -> Link:
        _, link = await asyncio.get_running_loop().create_connection(cls, host, port)
        link.transport.write(token)
        return link

    def call(self, *args: Any) -> asyncio.Future:
        """The future of the served function's answer to `args` (`infer` at a batching
        actor: bundle, caller, sent; `run` at a replica: the batch's items)."""
        fut = asyncio.get_running_loop().create_future()
        if self.closed:
            fut.set_exception(LinkLost("the connection was closed"))
            return fut
        self.next_id += 1
        self.open[self.next_id] = fut
        self.transport.write(_frame(self.next_id, INFER, pickle.dumps(args, protocol=5)))
        return fut

    def cancel(self, caller: str, keys: list[Any], *more: Any) -> None:
        """`more`: the model, at an actor that runs a group of them."""
        if not self.closed:
            self.transport.write(_frame(0, CANCEL, pickle.dumps((caller, keys, *more),
                                                                protocol=5)))

    def frame(self, cid: int, kind: int, payload: bytes) -> None:
        fut = self.open.pop(cid, None)
        if fut is None or fut.done():
            return
        try:
            value = pickle.loads(payload)
        except Exception as e:
            fut.set_exception(LinkLost(f"an unreadable answer: {e!r}"))
            return
        if kind == REPLY:
            fut.set_result(value)
        else:
            fut.set_exception(value if isinstance(value, BaseException) else LinkLost(
                f"the other end answered {value!r}"))

    def connection_lost(self, exc: BaseException | None) -> None:
        self.closed = True
        why = LinkLost(f"the connection ended ({exc or 'closed'})")
        for fut in self.open.values():
            if not fut.done():
                fut.set_exception(why)
        self.open.clear()

    def close(self) -> None:
        self.closed = True
        if self.transport is not None:
            self.transport.close()


class ThreadedLinkServer:
    """A `LinkServer` for a sync actor (a model replica): its own event loop on a thread of
    its own; each call runs `fn(*args)` on one of `workers` threads (the replica's pipeline
    slots), so the next batch is read off the socket while one runs; with one worker, on
    the loop's thread itself (the next frame waits in the socket). `initializer` runs first
    on each of these threads (a replica pins them to its cores)."""

    def __init__(self, fn: Callable[..., Any], workers: int,
                 initializer: Callable[[], None] | None = None) -> None:
        self.loop = asyncio.new_event_loop()
        self.calls = 0  # calls served
        ready = threading.Event()

        def serve() -> None:
            if initializer is not None:
                initializer()
            ready.set()
            self.loop.run_forever()

        threading.Thread(target=serve, name="link", daemon=True).start()
        ready.wait()
        if workers > 1:
            pool = ThreadPoolExecutor(workers, thread_name_prefix="link-call",
                                      initializer=initializer)

            async def call(*args: Any) -> Any:
                self.calls += 1
                return await asyncio.get_running_loop().run_in_executor(pool, fn, *args)
        else:  # one call at a time: on the loop's own thread, no hop to another and back
            async def call(*args: Any) -> Any:
                self.calls += 1
                return fn(*args)

        async def cancel(*args: Any) -> int:
            return 0  # a batch sent to a replica runs: its caller drops what it gave up on

        self.server = LinkServer(call, cancel)

    def address(self, host: str) -> tuple[str, int, bytes]:
        return asyncio.run_coroutine_threadsafe(self.server.address(host), self.loop).result(30)


def listen_host(caller_node: str | None) -> str:
    """Where an actor listens for a caller on Ray node `caller_node`: 127.0.0.1 when that
    is the actor's own node, else the node's address."""
    import ray

    if caller_node is not None and caller_node == node_id():
        return "127.0.0.1"
    return ray.util.get_node_ip_address()


class Dialer:
    """A caller's connection to one actor (its `link_address`), opened in the background
    the first time it is wanted (`dial`); until it is open, or for `RETRY_S` after it could
    not be (said once in the log), the caller makes Ray calls."""

    def __init__(self, what: str) -> None:
        self.what = what  # the actor, in the log
        self.link: Link | None = None
        self._opening: asyncio.Task | None = None
        self._retry_at = 0.0
        self._warned = False

    def live(self) -> Link | None:
        """The connection, if it is open."""
        link = self.link
        return link if link is not None and not link.closed else None

    def dial(self, actor: Any, wanted: Callable[[], bool] = lambda: True) -> None:
        """Start opening a connection to `actor`, unless one is opening or it is too soon;
        it is kept once open if `wanted()` still says so (the actor was not replaced)."""
        if not hasattr(actor, "link_address"):
            return  # a stand-in (the engine in the ingress, `client._ViaIngress`): Ray calls
        if self._opening is None and asyncio.get_running_loop().time() >= self._retry_at:
            self._opening = detached_task(self._open(actor, wanted))

    async def _open(self, actor: Any, wanted: Callable[[], bool]) -> None:
        try:
            link = await Link.open_to(*await actor.link_address.remote(node_id()))
        except Exception as e:
            self._retry_at = asyncio.get_running_loop().time() + RETRY_S
            (log.debug if self._warned else log.warning)(
                "no direct connection to %s (%r): Ray calls instead; trying again every "
                "%.0f s", self.what, e, RETRY_S)
            self._warned = True
            return
        finally:
            self._opening = None
        if wanted():
            self.link = link
        else:
            link.close()

    def drop(self, link: Link) -> None:
        """`link` ended: forget it (not a newer one)."""
        if self.link is link:
            self.link = None

    def close(self) -> None:
        link, self.link = self.link, None
        if link is not None:
            try:
                link.close()
            except RuntimeError:  # its loop has ended: so has the connection
                pass
