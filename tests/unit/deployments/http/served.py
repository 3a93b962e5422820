"""Talking to Raybatch's own HTTP server over a real socket, for its tests: raw requests,
responses read back (lengths, chunked, to the close), and an app served on the test's loop."""

from __future__ import annotations

import asyncio
import json

from deployments.http.native.front import FrontServer
from deployments.http.pyserver.server import HttpServer
from tests.unit.deployments.http.fakes import make_app
from tests.unit.deployments.http.wire import front_by_default

INFER = "/v2/models/square/infer"


def request(method: str, path: str, body: bytes = b"", headers: dict | None = None,
            version: str = "1.1") -> bytes:
    lines = [f"{method} {path} HTTP/{version}", "host: 127.0.0.1"]
    headers = dict(headers or {})
    if body and "transfer-encoding" not in {k.lower() for k in headers}:
        headers.setdefault("content-length", str(len(body)))
    lines += [f"{k}: {v}" for k, v in headers.items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


class Response:
    def __init__(self, status: int, headers: dict[str, str], body: bytes) -> None:
        self.status, self.headers, self.body = status, headers, body

    def json(self):
        return json.loads(self.body)


async def read_response(reader: asyncio.StreamReader, head: bool = False) -> Response:
    line = await reader.readline()
    if not line:
        raise ConnectionResetError("closed before a response")
    status = int(line.split()[1])
    headers = {}
    while (line := await reader.readline()) not in (b"\r\n", b""):
        k, v = line.decode().split(":", 1)
        headers[k.strip().lower()] = v.strip()
    if head or status in (100, 204, 304):
        return Response(status, headers, b"")
    if "content-length" in headers:
        return Response(status, headers, await reader.readexactly(int(headers["content-length"])))
    if headers.get("transfer-encoding") == "chunked":
        body = b""
        while True:
            size = int((await reader.readline()).strip(), 16)
            chunk = await reader.readexactly(size + 2)
            if size == 0:
                return Response(status, headers, body)
            body += chunk[:-2]
    return Response(status, headers, await reader.read())


class Served:
    """An app on a real HttpServer, on the test's loop."""

    def __init__(self, quick: bool = True, front: bool | None = None, **limits) -> None:
        self.app, self.backend = make_app(**limits)
        if front is None:
            front = front_by_default() and quick
        size = limits.get("max_header_bytes", 16 * 1024)
        if front:
            self.server = FrontServer(self.app, port=0, reuse_port=False, max_header_bytes=size)
        else:
            self.server = HttpServer(self.app.direct, port=0, reuse_port=False,
                                     max_header_bytes=size,
                                     quick=self.app.quick if quick else None)

    async def __aenter__(self) -> Served:
        await self.server.start()
        return self

    async def __aexit__(self, *exc) -> None:
        await self.server.stop(1.0)

    async def connect(self):
        return await asyncio.open_connection("127.0.0.1", self.server.port)

    async def one(self, raw: bytes) -> Response:
        r, w = await self.connect()
        w.write(raw)
        try:
            return await read_response(r)
        finally:
            w.close()
