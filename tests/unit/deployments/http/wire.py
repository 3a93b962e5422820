"""Bytes on a socket against `deployments.http.pyserver.server`, from plain blocking sockets.

`ServerThread` runs the server (with the OIP app on a fake backend, or an echo app that
answers each request with its method, target and body) on an event loop of its own
thread, so a test, a hypothesis property or a load can talk to it synchronously;
`exchange` sends bytes and reads every response until the server closes (or a count is
reached), and `parse_responses` frames what came back (1xx, Content-Length, chunked,
until close).
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import socket
import threading
import time
from dataclasses import dataclass, field
from typing import Any

from deployments.http.native.front import FrontServer, available
from deployments.http.pyserver.server import HttpServer
from tests.unit.deployments.http.fakes import make_app


async def echo_app(scope: dict, receive: Any, send: Any) -> None:
    """Answers a request with what the server framed of it: method, target, body."""
    body = b""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    target = scope["raw_path"] + (b"?" + scope["query_string"] if scope["query_string"] else b"")
    doc = {"method": scope["method"], "target": target.decode("latin-1"), "length": len(body),
           "sha": hashlib.sha1(body).hexdigest()}
    out = json.dumps(doc).encode()
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", b"%d" % len(out))]})
    await send({"type": "http.response.body", "body": out})


def front_by_default() -> bool:
    """RAYBATCH_TEST_FRONT=1 runs every server test behind the native front."""
    return os.environ.get("RAYBATCH_TEST_FRONT") == "1" and available()


class ServerThread:
    """The server on a loop of its own thread: `with ServerThread() as s: s.port`."""

    def __init__(self, app: str = "oip", quick: bool = True, limits: dict | None = None,
                 front: bool | None = None, **server: Any) -> None:
        self.kind, self.quick, self.limits, self.server_kwargs = app, quick, limits or {}, server
        self.front = front_by_default() if front is None else front
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, daemon=True)
        self.server: HttpServer | None = None
        self.app: Any = None
        self.backend: Any = None

    def __enter__(self) -> ServerThread:
        self.thread.start()
        self.call(self._start)
        return self

    def __exit__(self, *exc: Any) -> None:
        self.call(lambda: self.server.stop(0.5))
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)

    async def _start(self) -> None:
        if self.kind == "oip":
            self.app, self.backend = make_app(**self.limits)
            app, quick = self.app.direct, self.app.quick if self.quick else None
        else:
            app, quick = echo_app, None
        if self.front:
            self.server = FrontServer(self.app if self.kind == "oip" and self.quick else app,
                                      port=0, reuse_port=False, **self.server_kwargs)
        else:
            self.server = HttpServer(app, port=0, reuse_port=False, quick=quick,
                                     **self.server_kwargs)
        await self.server.start()

    def call(self, fn: Any, timeout_s: float = 10.0) -> Any:
        """Run `fn()` (a coroutine function, or a plain one) on the server's loop."""
        async def wrapped() -> Any:
            out = fn()
            return await out if asyncio.iscoroutine(out) else out
        return asyncio.run_coroutine_threadsafe(wrapped(), self.loop).result(timeout_s)

    @property
    def port(self) -> int:
        return self.server.port

    def connect(self, timeout_s: float = 5.0) -> socket.socket:
        sock = socket.create_connection(("127.0.0.1", self.port), timeout=timeout_s)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock


@dataclass
class Response:
    status: int
    headers: dict[str, str]
    body: bytes
    raw_headers: list[tuple[str, str]] = field(default_factory=list)

    def json(self) -> Any:
        return json.loads(self.body)


@dataclass
class Exchange:
    responses: list[Response]
    closed: bool  # the server closed (FIN) before the reading stopped
    reset: bool = False  # ... or reset the connection
    rest: bytes = b""  # bytes that do not make a whole response

    @property
    def statuses(self) -> list[int]:
        return [r.status for r in self.responses]


def parse_responses(data: bytes, head_only: bool = False) -> tuple[list[Response], bytes]:
    """Whole responses at the start of `data` (1xx included), and what is left over."""
    out: list[Response] = []
    while True:
        end = data.find(b"\r\n\r\n")
        if end < 0:
            return out, data
        lines = data[:end].decode("latin-1").split("\r\n")
        parts = lines[0].split(" ", 2)
        status = int(parts[1])
        raw = [tuple(x.strip() for x in line.split(":", 1)) for line in lines[1:]]
        headers = {k.lower(): v for k, v in raw}
        rest = data[end + 4:]
        if 100 <= status < 200 or status in (204, 304) or head_only:
            body = b""
        elif "content-length" in headers:
            n = int(headers["content-length"])
            if len(rest) < n:
                return out, data
            body, rest = rest[:n], rest[n:]
        elif headers.get("transfer-encoding") == "chunked":
            body, pos = b"", 0
            while True:
                eol = rest.find(b"\r\n", pos)
                if eol < 0:
                    return out, data
                size = int(rest[pos:eol], 16)
                if len(rest) < eol + 2 + size + 2:
                    return out, data
                body += rest[eol + 2:eol + 2 + size]
                pos = eol + 2 + size + 2
                if size == 0:
                    break
            rest = rest[pos:]
        else:
            body, rest = rest, b""  # until close
        out.append(Response(status, headers, body, raw))
        data = rest


def exchange(port_or_sock: Any, raw: bytes | list[bytes], *, half_close: bool = True,
             count: int | None = None, timeout_s: float = 5.0, gap_s: float = 0.0) -> Exchange:
    """Send `raw` (pieces `gap_s` apart), then read until the server closes, `count` final
    (non-1xx) responses have come, or `timeout_s` passes."""
    sock = port_or_sock if isinstance(port_or_sock, socket.socket) else \
        socket.create_connection(("127.0.0.1", port_or_sock), timeout=timeout_s)
    pieces = [raw] if isinstance(raw, bytes) else raw
    reset = closed = False
    data = b""
    try:
        for i, piece in enumerate(pieces):
            if i and gap_s:
                time.sleep(gap_s)
            sock.sendall(piece)
        if half_close:
            sock.shutdown(socket.SHUT_WR)
    except (BrokenPipeError, ConnectionResetError):
        reset = True
    give_up = time.monotonic() + timeout_s
    while not reset:
        if count is not None:
            got, _ = parse_responses(data)
            if sum(r.status >= 200 for r in got) >= count:
                break
        sock.settimeout(max(0.01, give_up - time.monotonic()))
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            break
        except ConnectionResetError:
            reset = True
            break
        if not chunk:
            closed = True
            break
        data += chunk
    if not isinstance(port_or_sock, socket.socket):
        sock.close()
    responses, rest = parse_responses(data)
    return Exchange(responses, closed, reset, rest)


def request(method: str, target: str, body: bytes = b"", *, version: str = "1.1",
            host: bool = True, **headers: str) -> bytes:
    """One request's bytes: `headers` with `_` for `-`; Content-Length from the body."""
    lines = [f"{method} {target} HTTP/{version}"]
    if host:
        lines.append("host: 127.0.0.1")
    named = {k.replace("_", "-"): v for k, v in headers.items()}
    if body and "transfer-encoding" not in named and "content-length" not in named:
        named["content-length"] = str(len(body))
    lines += [f"{k}: {v}" for k, v in named.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body
