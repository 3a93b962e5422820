"""Bodies a hostile client sends, through real sockets, on both fronts: a chunked body
that never ends is refused at the limit, not read to its end, and the server stays
well; a body larger than the limit but declared is refused before it is read."""

from __future__ import annotations

import json
import select
import socket
import time
from urllib.parse import urlsplit

import pytest

pytestmark = pytest.mark.e2e

MB = 2**20


def _connect(front_url: str) -> socket.socket:
    url = urlsplit(front_url)
    s = socket.create_connection((url.hostname, url.port), timeout=30)
    s.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 256 * 1024)
    return s


def _pump_until_answered(s: socket.socket, piece: bytes, most_bytes: int,
                         timeout_s: float = 60.0) -> tuple[int, bytes]:
    """Send `piece` again and again until the server answers (or hangs up), at most
    `most_bytes`; returns what was sent and what came back (to the close)."""
    sent, give_up = 0, time.monotonic() + timeout_s
    s.setblocking(False)
    while sent < most_bytes and time.monotonic() < give_up:
        readable, writable, _ = select.select([s], [s], [], 1.0)
        if readable:
            break
        if writable:
            try:
                sent += s.send(piece)
            except (BrokenPipeError, ConnectionResetError, BlockingIOError):
                break
    s.setblocking(True)
    s.settimeout(30)
    answer = b""
    try:
        while chunk := s.recv(65536):
            answer += chunk
            if b"\r\n\r\n" in answer and answer.endswith(b"}"):
                break
    except (ConnectionResetError, TimeoutError):
        pass
    return sent, answer


def _own_server(app, front_url: str) -> bool:
    """Is `front_url` Raybatch's own server? It stops reading a body it refuses; Serve's
    proxy reads ahead of the replica as fast as the machine lets it until the replica's
    413 comes back, so how much it took is the machine's speed, not a behaviour."""
    return urlsplit(front_url).port == app.config.ingress.native_port


def _status_and_error(answer: bytes) -> tuple[int, str]:
    head, _, body = answer.partition(b"\r\n\r\n")
    status = int(head.split(b" ", 2)[1])
    return status, json.loads(body)["error"]


def test_a_chunked_body_that_never_ends_is_413_without_being_read_to_its_end(app, front_url):
    limit = app.config.ingress.max_body_bytes
    with _connect(front_url) as s:
        s.sendall(b"POST /v2/models/square/infer HTTP/1.1\r\nHost: t\r\n"
                  b"Content-Type: application/json\r\nTransfer-Encoding: chunked\r\n\r\n")
        piece = b"10000\r\n" + b" " * 0x10000 + b"\r\n"  # 64 KiB chunks, forever
        sent, answer = _pump_until_answered(s, piece, 256 * MB)
    status, error = _status_and_error(answer)
    assert status == 413 and f"more than {limit} bytes" in error
    if _own_server(app, front_url):
        assert sent < 64 * MB  # refused near the limit, not after reading everything sent


def test_a_declared_body_past_the_limit_is_refused_before_it_is_read(app, front_url):
    with _connect(front_url) as s:
        s.sendall(b"POST /v2/models/square/infer HTTP/1.1\r\nHost: t\r\n"
                  b"Content-Type: application/json\r\nContent-Length: 1000000000\r\n\r\n")
        sent, answer = _pump_until_answered(s, b" " * 65536, 256 * MB)
    status, error = _status_and_error(answer)
    assert status == 413 and "1000000000 bytes (Content-Length)" in error
    if _own_server(app, front_url):
        assert sent < 64 * MB


def test_the_app_serves_after_them(front_url):
    import httpx

    r = httpx.post(f"{front_url}/v2/models/square/infer", timeout=30, json={"inputs": [
        {"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [5.0]}]})
    assert r.status_code == 200 and r.json()["outputs"][0]["data"] == [25.0]
