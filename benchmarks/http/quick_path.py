"""CPU of the whole quick lane per request, in one process: bytes in, bytes out.

    python -m benchmarks.http.quick_path [--requests N] [--concurrency C] [--json-http]
        [--no-freeze] [--profile OUT.prof]

What an ingress replica runs per HTTP infer request on its own server, without the
sockets: C connections of `deployments.http.connection.Connection` on fake transports,
each fed a whole request (the bytes wrk sends) as soon as its previous answer is written,
through the real app (`OipApp.quick`), `ServeBackend`, `ModelRoute`, `LocalEngine` and
`BatchHost`, to a model replica that echoes its inputs (`front_path.Echo`). Left out: the
socket reads and writes (system time), uvloop's own C, and the model's compute. So the
figure is the Python the ingress runs per request, measured as this process's CPU time
(other processes on the machine do not change it), and quick enough to run after each
change. The startup heap is frozen as an ingress replica freezes it (`deployments.heap`)
unless `--no-freeze`. Every answer's status line is checked (200).
"""

from __future__ import annotations

import asyncio
import cProfile
import time
from typing import Any

import numpy as np

from benchmarks.http.front_path import build_app, window_arguments
from benchmarks.serve.drivers import http_body
from deployments.heap import freeze_startup_heap
from deployments.http.connection import FIRST_SLICE, Connection


class Server:
    """What a Connection reads of its server (`deployments.http.server.HttpServer`)."""

    max_unsent_bytes, max_pipelined, max_header_bytes = 2**20, 16, 16 * 2**10
    max_head_bytes = 2 * max_header_bytes + FIRST_SLICE + 1024
    root_path, header_timeout_s = "", 10.0

    def __init__(self, quick: Any) -> None:
        self._loop = asyncio.get_running_loop()
        self.quick = quick
        self.connections: set[Connection] = set()

    def admit(self, conn: Connection) -> None:
        self.connections.add(conn)


class Window:
    """`total` requests over `c` connections, each sent when the last answer is written."""

    def __init__(self, request: bytes, total: int) -> None:
        self.request, self.left, self.answers, self.total = request, total, 0, total
        self.wrong: list[bytes] = []
        self.done = asyncio.get_running_loop().create_future()

    def answered(self, conn: Connection, parts: list[Any]) -> None:
        self.answers += 1
        if bytes(parts[0][:12]) != b"HTTP/1.1 200":
            self.wrong.append(b"".join(bytes(p) for p in parts)[:300])
        if self.left > 0:
            self.left -= 1
            conn.loop.call_soon(conn.data_received, self.request)
        elif self.answers == self.total and not self.done.done():
            self.done.set_result(None)


class Transport:
    def __init__(self, window: Window) -> None:
        self.window, self.conn = window, None

    def writelines(self, parts: list[Any]) -> None:
        self.window.answered(self.conn, parts)

    def write(self, data: bytes) -> None:
        self.window.answered(self.conn, [data])

    def get_extra_info(self, key: str) -> Any:
        return ("127.0.0.1", 40000)

    def set_write_buffer_limits(self, high: int) -> None:
        pass

    def pause_reading(self) -> None:
        pass

    def resume_reading(self) -> None:
        pass

    def can_write_eof(self) -> bool:
        return True

    def close(self) -> None:
        raise SystemExit("the server closed a connection: " + repr(self.window.wrong[:1]))


async def window(server: Server, request: bytes, total: int, c: int) -> int:
    """Run `total` requests; returns how many were not answered 200."""
    w = Window(request, total - c)
    w.total = total
    for _ in range(c):
        t = Transport(w)
        t.conn = conn = Connection(server)
        conn.connection_made(t)
        conn.loop.call_soon(conn.data_received, request)
    await w.done
    return len(w.wrong)


def request_bytes(json_http: bool) -> bytes:
    x = np.random.default_rng(0).standard_normal((1, 256), dtype=np.float32)
    body, headers = http_body(x, not json_http)
    head = b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: 127.0.0.1:8088\r\n"
    head += b"".join(f"{k}: {v}\r\n".encode() for k, v in headers.items())
    return head + b"Content-Length: %d\r\n\r\n" % len(body) + body


async def main_async(args: Any) -> None:
    app = build_app(args.model)
    server = Server(app.quick)
    request = request_bytes(args.json_http)
    await window(server, request, 5000, args.concurrency)  # warm up
    if not args.no_freeze:
        freeze_startup_heap("benchmark")
    prof = cProfile.Profile() if args.profile else None
    best = float("inf")
    for _ in range(args.repeats):
        if prof:
            prof.enable()
        c0, t0 = time.process_time(), time.perf_counter()
        failed = await window(server, request, args.requests, args.concurrency)
        cpu, wall = time.process_time() - c0, time.perf_counter() - t0
        if prof:
            prof.disable()
        if failed:
            raise SystemExit(f"{failed} of {args.requests} answers were not 200")
        us = cpu / args.requests * 1e6
        best = min(best, us)
        print(f"{args.requests} requests, C={args.concurrency}, "
              f"{'JSON' if args.json_http else 'binary'}: {us:6.1f} us CPU/request, "
              f"{args.requests / wall:8,.0f} req/s")
    print(f"best: {best:.1f} us CPU/request")
    if prof:
        prof.dump_stats(args.profile)


def main() -> None:
    ap = window_arguments(__doc__, "mlp")
    ap.add_argument("--json-http", action="store_true")
    ap.add_argument("--no-freeze", action="store_true")
    ap.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop",
                    help="the event loop (an ingress replica runs on uvloop)")
    args = ap.parse_args()
    if args.loop == "uvloop":
        import uvloop

        uvloop.run(main_async(args))
    else:
        asyncio.run(main_async(args))


if __name__ == "__main__":
    main()
