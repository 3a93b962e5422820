"""CPU of the whole quick lane per request, in one process: bytes in, bytes out.

    python -m benchmarks.http.quick_path [--requests N] [--concurrency C] [--json-http]
        [--items N] [--refuse] [--no-freeze] [--profile OUT.prof]

What an ingress replica runs per HTTP infer request on its own server, without the
sockets: C connections of `deployments.http.pyserver.connection.Connection` on fake transports,
each fed a whole request (the bytes wrk sends) as soon as its previous answer is written,
through the real app (`OipApp.quick`), `ServeBackend`, `ModelRoute`, `LocalEngine` and
`BatchHost`, to a model replica that echoes its inputs (`front_path.Echo`). Left out: the
socket reads and writes (system time), uvloop's own C, and the model's compute. So the
figure is the Python the ingress runs per request, measured as this process's CPU time
(other processes on the machine do not change it), and quick enough to run after each
change. The startup heap is frozen as an ingress replica freezes it (`deployments.heap`)
unless `--no-freeze`. Every answer's status line is checked (200). `--items N` sends N
rows per request. `--refuse`: the replica never answers, so once the engine's queue holds
`limits.max_queue_wait_s` of predicted work every request is refused (429, checked): the
figure is then what it costs the ingress to refuse a request under overload.
"""

from __future__ import annotations

import asyncio
import cProfile
import time
from collections import deque
from typing import Any

import numpy as np

from benchmarks.http.front_path import Stuck, build_app, window_arguments
from benchmarks.serve.drivers import http_body
from deployments.heap import freeze_startup_heap
from deployments.http.pyserver.connection import FIRST_SLICE, Connection
from deployments.http.pyserver.server import TURN_READS, HttpServer


class Server:
    """What a Connection reads of its server (`deployments.http.pyserver.server.HttpServer`)."""

    max_unsent_bytes, max_pipelined, max_header_bytes = 2**20, 16, 16 * 2**10
    max_head_bytes = 2 * max_header_bytes + FIRST_SLICE + 1024
    root_path, header_timeout_s = "", 10.0

    turn_spent, _next_turn = HttpServer.turn_spent, HttpServer._next_turn  # its turns

    def __init__(self, app: Any) -> None:
        self._loop = asyncio.get_running_loop()
        self.app, self.quick = app.direct, app.quick  # what the quick lane declines: ASGI
        self.connections: set[Connection] = set()
        self.turn_reads, self._reads, self._turn_due = TURN_READS, 0, False
        self._waiting: deque[Connection] = deque()

    def admit(self, conn: Connection) -> None:
        self.connections.add(conn)


class Window:
    """`total` requests over `c` connections, each sent when the last answer is written."""

    def __init__(self, request: bytes, total: int, c: int, status: bytes = b"200") -> None:
        self.request, self.left, self.answers, self.total = request, total - c, 0, total
        self.status = b"HTTP/1.1 " + status
        self.closed = 0
        self.wrong: list[bytes] = []
        self.done = asyncio.get_running_loop().create_future()

    def answered(self, conn: Connection, parts: list[Any]) -> None:
        self.answers += 1
        if bytes(parts[0][:12]) != self.status:
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
        self.window.closed += 1  # counted as a failure of its window


def connect(server: Server, w: Window) -> Connection:
    """A new connection of `server` whose answers go to `w`."""
    t = Transport(w)
    t.conn = conn = Connection(server)
    conn.connection_made(t)
    return conn


async def window(server: Server, request: bytes, total: int, c: int,
                 status: bytes = b"200") -> int:
    """Run `total` requests; returns how many were not answered `status`."""
    w = Window(request, total, c, status)
    for _ in range(c):
        conn = connect(server, w)
        conn.loop.call_soon(conn.data_received, request)
    await w.done
    return len(w.wrong) + w.closed


def request_bytes(json_http: bool, items: int = 1) -> bytes:
    x = np.random.default_rng(0).standard_normal((items, 256), dtype=np.float32)
    body, headers = http_body(x, not json_http)
    head = b"POST /v2/models/mlp/infer HTTP/1.1\r\nHost: 127.0.0.1:8088\r\n"
    head += b"".join(f"{k}: {v}\r\n".encode() for k, v in headers.items())
    return head + b"Content-Length: %d\r\n\r\n" % len(body) + body


async def main_async(args: Any) -> None:
    app = build_app(args.model, Stuck() if args.refuse else None)
    server = Server(app)
    request = request_bytes(args.json_http, args.items)
    status = b"429" if args.refuse else b"200"
    if args.refuse:  # fill the queue to its bound (those requests are never answered)
        while True:
            w = Window(request, 1, 1, b"429")  # done at the first answer: a refusal
            for _ in range(64):
                connect(server, w).data_received(request)
            try:
                await asyncio.wait_for(asyncio.shield(w.done), 0.3)
                break
            except asyncio.TimeoutError:
                continue
    await window(server, request, 5000, args.concurrency, status)  # warm up
    if not args.no_freeze:
        freeze_startup_heap("benchmark")
    prof = cProfile.Profile() if args.profile else None
    best = float("inf")
    for _ in range(args.repeats):
        if prof:
            prof.enable()
        c0, t0 = time.process_time(), time.perf_counter()
        failed = await window(server, request, args.requests, args.concurrency, status)
        cpu, wall = time.process_time() - c0, time.perf_counter() - t0
        if prof:
            prof.disable()
        if failed:
            raise SystemExit(f"{failed} of {args.requests} answers were not {status.decode()}")
        us = cpu / args.requests * 1e6
        best = min(best, us)
        print(f"{args.requests} requests of {args.items} items, C={args.concurrency}, "
              f"{'JSON' if args.json_http else 'binary'}, {status.decode()}: "
              f"{us:6.1f} us CPU/request, "
              f"{args.requests / wall:8,.0f} req/s")
    print(f"best: {best:.1f} us CPU/request")
    if prof:
        prof.dump_stats(args.profile)


def main() -> None:
    ap = window_arguments(__doc__, "mlp")
    ap.add_argument("--json-http", action="store_true")
    ap.add_argument("--no-freeze", action="store_true")
    ap.add_argument("--items", type=int, default=1, help="rows per request")
    ap.add_argument("--refuse", action="store_true",
                    help="a replica that never answers: measure refusing (429)")
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
