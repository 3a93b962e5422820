"""`OipApp`: the Open Inference Protocol as one raw ASGI callable.

Per request it does, in order: refuse at once when draining or full (503 with
Retry-After), check the headers (431), match the route (404/405), run the handler,
send its reply, count (route template, status). Nothing else: no Request object,
no middleware stack, no dependency injection. Every failure goes through one
error writer (`deployments.http.oip.errors.error_parts`), so every 4xx/5xx has the
shape `{"error": ...}`, and a response whose request body was not read to the end
closes the connection (that rest must not be read as the next request).

On Raybatch's own server (`deployments.http.pyserver.server`) infer requests take the quick
lane (`OipApp.quick`): the same parse, engine and encoding, answered from the
engine's callback without a coroutine; the answer is the same to the byte.

Mounted two ways, the same object: as the Serve ingress's ASGI app
(`@serve.ingress`), or in front of Serve's per-request wrapper as a direct-ingress
middleware (`deployments.http.oip.fastpath`). The second skips Serve's queueing and
`max_ongoing_requests`, so the app keeps its own bound on requests in flight, a
draining flag, and response counts for the metrics to read.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from deployments.http.oip.backend import Backend, ModelEntry
from deployments.http.oip.body import BodyReader
from deployments.http.oip.errors import (
    ClientGone,
    HeadersTooLarge,
    TooManyStreams,
    Unavailable,
    error_parts,
    log_error,
)
from deployments.http.oip.handlers import infer as infer_handler
from deployments.http.oip.handlers import oip_routes
from deployments.http.oip.limits import HttpLimits
from deployments.http.oip.openai import is_openai_path, openai_routes
from deployments.http.oip.replies import CLOSE, Reply, json_reply, send_reply, send_stream
from deployments.http.oip.routes import Router
from deployments.protocol import (
    DEFAULT_EXTENSIONS,
    LowerHeaders,
    encode_infer_raw,
    parse_infer_request,
    server_metadata_json,
)

# The request headers the protocol reads; the others are only counted.
_READ = {b"content-length", b"content-encoding", b"transfer-encoding",
         b"inference-header-content-length"}
UNMATCHED = "unmatched"


class Call:
    """One request as a handler sees it: path parameters, headers, a body reader."""

    __slots__ = ("app", "backend", "body_unread", "headers", "params", "receive",
                 "received_s", "scope")

    def __init__(self, app: OipApp, receive: Any, headers: dict[str, str], scope: dict) -> None:
        self.app = app
        self.received_s = time.monotonic()  # an infer request's timeout counts from here
        self.backend = app.backend
        self.receive = receive
        self.headers = headers
        self.scope = scope
        self.params: dict[str, str] = {}
        self.body_unread = headers.get("content-length", "0") != "0" or (
            "transfer-encoding" in headers)

    @property
    def client(self) -> str:
        """The client's address (what its event streams are counted by)."""
        return _client(self.scope)

    def model(self) -> ModelEntry:
        return self.backend.model(self.params["model"], self.params.get("version"))

    async def body(self) -> bytes:
        """The body, read within the limits (413 past the size, 408 when it stalls)."""
        declared = self.headers.get("content-length")
        body = await self.app.body_reader.read(
            self.receive, int(declared) if declared and declared.isascii()
            and declared.isdigit() else None)
        self.body_unread = False
        return body


class StreamSlot:
    """One open event stream of one client; `release` exactly once."""

    __slots__ = ("app", "client", "held")

    def __init__(self, app: OipApp, client: str) -> None:
        self.app, self.client, self.held = app, client, True

    def release(self) -> None:
        if self.held:
            self.held = False
            left = self.app.streams[self.client] - 1
            if left:
                self.app.streams[self.client] = left
            else:
                del self.app.streams[self.client]


class OipApp:
    """The ASGI app. `backend` runs the models; `limits` bound what a client may hold.

    >>> app = OipApp(backend, HttpLimits(max_inflight_requests=512))   # doctest: +SKIP
    """

    def __init__(self, backend: Backend, limits: HttpLimits | None = None, *,
                 name: str = "raybatch", version: str | None = None,
                 extensions: Sequence[str] = DEFAULT_EXTENSIONS) -> None:
        """`name`, `version`, `extensions`: what `GET /v2` answers (the gRPC front
        answers the same: the ingress gives both the same)."""
        self.backend = backend
        self.limits = limits or HttpLimits()
        self.request_limits = self.limits.request
        self.body_reader = BodyReader(self.limits.max_body_bytes, self.limits.body_timeout_s)
        self.router = Router([*oip_routes(), *openai_routes()])
        self.metadata_reply = json_reply(server_metadata_json(name, version, extensions))
        self.max_inflight = self.limits.max_inflight_requests
        self.inflight = 0
        self.draining = False
        self.counts: dict[tuple[str, int], int] = {}  # (route template, status) -> responses
        self.streams: dict[str, int] = {}  # client address -> open event streams
        self._idle: asyncio.Event | None = None
        self._submit = getattr(backend, "submit_infer", None)  # the quick lane needs it

    async def __call__(self, scope: dict, receive: Any, send: Any) -> None:
        """The app as an ASGI app, under whatever server or wrapper mounts it."""
        await self._entry(scope, receive, send, False)

    async def direct(self, scope: dict, receive: Any, send: Any) -> None:
        """The app where it writes to the HTTP server itself (the fast path): large binary
        outputs go out as views of their arrays, not joined into one copy first."""
        await self._entry(scope, receive, send, True)

    async def _entry(self, scope: dict, receive: Any, send: Any, zero_copy: bool) -> None:
        if scope["type"] != "http":
            return await self._not_http(scope, receive, send)
        if self.draining or self.inflight >= self.max_inflight:
            return await self._refuse(scope, send)
        self.inflight += 1
        method, path = scope["method"], _route_path(scope)
        template, call, started = UNMATCHED, None, False
        try:
            call = Call(self, receive, self._headers(scope["headers"]), scope)
            route, call.params = self.router.match(method, path)
            template = route.template
            reply = await route.handler(call)
            started = True
            if type(reply) is Reply:
                await send_reply(send, reply, call.body_unread, zero_copy)
                status = reply.status
            else:
                status = 200 if await send_stream(send, receive, reply) else 499
        except ClientGone:
            status = 499
        except asyncio.CancelledError:
            self._count(template, 499)
            raise
        except Exception as exc:
            status = await self._fail(send, exc, started, call, method, path)
            template = getattr(exc, "template", template)  # a 405 knows its route
        finally:
            self.inflight -= 1
            if self.inflight == 0 and self._idle is not None:
                self._idle.set()
        self._count(template, status)

    async def _fail(self, send: Any, exc: Exception, started: bool, call: Call | None,
                    method: str, path: str) -> int:
        status, body, headers = error_parts(exc, is_openai_path(path))
        log_error(exc, status, method, path)
        if started:  # the status line is gone already: nothing more to say
            return status
        if call is None or call.body_unread:
            headers.append(CLOSE)
        await send_reply(send, Reply(status, body, headers), False, False)
        return status

    # -- the quick lane: infer requests without a coroutine --------------------------------
    def quick(self, cycle: Any) -> bool:
        """Take an infer request whose body is whole (`deployments.http.pyserver.server` calls this
        for a POST that fits its read buffer): parse it, submit it to the engine and
        answer from the engine's callback, with no task, coroutine or ASGI message on the
        way; the answer is the one `infer` gives through ASGI, byte for byte. False (and
        nothing done) for anything else: the ASGI app answers it."""
        submit = self._submit
        if submit is None or self.draining or self.inflight >= self.max_inflight:
            return False
        scope = cycle.scope
        method, path = scope["method"], _route_path(scope)
        try:
            route, params = self.router.match(method, path)
        except Exception:
            return False  # 404 / 405: the ASGI app says so
        if route.handler is not infer_handler or cycle.buffered > self.body_reader.max_bytes:
            return False  # not infer, or a 413 the body reader words (and closes)
        self.inflight += 1
        try:
            headers = self._headers(scope["headers"])
            model = self.backend.model(params["model"], params.get("version"))
            request = parse_infer_request(cycle.whole_body(), headers, model.spec,
                                          self.request_limits, remember=True)
            future, outputs = submit(model, request, time.monotonic())
        except Exception as exc:
            self._quick_error(cycle, route.template, exc)
            return True
        cycle.on_gone = future.cancel  # the client hung up: the engine drops the request
        future.add_done_callback(
            lambda f: self._quick_done(cycle, route.template, model, request, outputs, f))
        return True

    def _quick_done(self, cycle: Any, template: str, model: ModelEntry, request: Any,
                    outputs: Any, future: asyncio.Future) -> None:
        if future.cancelled():  # its client went away
            self._ended(template, 499)
            return
        try:
            parts, headers = encode_infer_raw(
                model.name, model.version, request.id, outputs(future.result()),
                request.outputs_requested, request.binary_data_output)
        except Exception as exc:
            self._quick_error(cycle, template, exc)
            return
        cycle.respond(200, headers, parts)
        self._ended(template, 200)

    def _quick_error(self, cycle: Any, template: str, exc: Exception) -> None:
        status, body, headers = error_parts(exc)
        scope = cycle.scope
        log_error(exc, status, scope["method"], scope["path"])
        cycle.respond(status, headers, [body])
        self._ended(template, status)

    def _ended(self, template: str, status: int) -> None:
        self.inflight -= 1
        if self.inflight == 0 and self._idle is not None:
            self._idle.set()
        self._count(template, status)

    def _headers(self, raw: list[tuple[bytes, bytes]]) -> dict[str, str]:
        """The headers the protocol reads; 431 past the header limits."""
        limits = self.limits
        if len(raw) > limits.max_header_count:
            raise HeadersTooLarge(f"the request has {len(raw)} headers, more than this "
                                  f"server's limit of {limits.max_header_count}")
        size = 0
        found = LowerHeaders()
        for name, value in raw:
            size += len(name) + len(value)
            if name in _READ:
                found[name.decode("latin-1")] = value.decode("latin-1")
        if size > limits.max_header_bytes:
            raise HeadersTooLarge(f"the request headers are {size} bytes, more than this "
                                  f"server's limit of {limits.max_header_bytes}")
        return found

    async def _refuse(self, scope: dict, send: Any) -> None:
        why = ("this replica is shutting down; retry, another replica will answer"
               if self.draining else f"this replica serves {self.inflight} requests, its "
               f"limit (ingress.max_inflight_requests); retry shortly")
        status, body, headers = error_parts(Unavailable(why), is_openai_path(scope["path"]))
        await send_reply(send, Reply(status, body, headers), True, False)
        self._count(self._template(scope), status)

    def _template(self, scope: dict) -> str:
        try:
            return self.router.match(scope["method"], _route_path(scope))[0].template
        except Exception:
            return UNMATCHED

    def _count(self, template: str, status: int) -> None:
        key = (template, status)
        self.counts[key] = self.counts.get(key, 0) + 1

    async def _not_http(self, scope: dict, receive: Any, send: Any) -> None:
        if scope["type"] == "lifespan":
            while True:
                message = await receive()
                if message["type"] == "lifespan.startup":
                    await send({"type": "lifespan.startup.complete"})
                elif message["type"] == "lifespan.shutdown":
                    self.begin_drain()
                    await send({"type": "lifespan.shutdown.complete"})
                    return
        elif scope["type"] == "websocket":
            await send({"type": "websocket.close", "code": 1003})

    # -- for the ingress, the drain and the metrics -----------------------------------
    def stream_slot(self, client: str) -> StreamSlot:
        """Hold one of `client`'s event streams; 429 past `max_streams_per_client`."""
        held = self.streams.get(client, 0)
        if held >= self.limits.max_streams_per_client:
            raise TooManyStreams(f"this client holds {held} open event streams, the limit "
                                 "(ingress.max_streams_per_client); close one or retry later")
        self.streams[client] = held + 1
        return StreamSlot(self, client)

    def begin_drain(self) -> None:
        """From now on, every new request gets 503 with Retry-After (connection closed)."""
        self.draining = True

    async def wait_idle(self, timeout_s: float) -> bool:
        """Wait until no request is in flight (True), or `timeout_s` passed (False)."""
        if self.inflight == 0:
            return True
        self._idle = self._idle or asyncio.Event()
        self._idle.clear()
        try:
            await asyncio.wait_for(self._idle.wait(), timeout_s)
        except asyncio.TimeoutError:
            return self.inflight == 0
        return True

    def response_counts(self) -> dict[tuple[str, int], int]:
        """A copy of the responses sent so far, by (route template, status)."""
        return dict(self.counts)


def _route_path(scope: dict) -> str:
    path, root = scope["path"], scope.get("root_path")
    if root and path.startswith(root):
        return path[len(root):] or "/"
    return path


def _client(scope: dict) -> str:
    client = scope.get("client")
    return client[0] if client else "unknown"
