"""The own HTTP server's resource bounds, measured: what hostile clients cost it.

Starts `deployments.http.pyserver.server.HttpServer` in a process of its own (uvloop, as in a
Serve replica) with a small echo app, then:

- **never-reading pipeliner**: one client pushes pipelined requests (up to 256 MiB) and
  reads nothing; reports what it managed to push and how the server's RSS moved;
- **slowloris**: N connections send a request head a byte at a time while an ordinary
  client sends requests one after another; reports the ordinary requests' latency with
  and without the slow heads, and what the slow ones got back (408 at header_timeout_s).

    python -m benchmarks.http.front_hostile --slowloris 1000 --push-mib 256 [--front]

`--front`: the same through the native front (`deployments.http.native.front.FrontServer`: its
thread holds the sockets, the echo app's requests are the Python server's through it).

Targets: RSS moved by <= 16 MiB for 256 MiB pushed; 1,000 slowloris connections delay
an ordinary request by <= 10 ms.
"""

from __future__ import annotations

import argparse
import os
import socket
import statistics
import subprocess
import sys
import time

REQUEST = b"POST /echo HTTP/1.1\r\nhost: a\r\ncontent-length: 1024\r\n\r\n" + b"x" * 1024
ANSWER_END = b'"ok"}'


def serve(port: int, header_timeout_s: float, front: bool = False) -> None:
    """The server process: an echo app on the own server, on uvloop."""
    import asyncio

    import uvloop

    from deployments.http.native.front import FrontServer
    from deployments.http.pyserver.server import HttpServer

    async def app(scope, receive, send):
        n = 0
        while True:
            message = await receive()
            if message["type"] != "http.request":
                return
            n += len(message.get("body", b""))
            if not message.get("more_body"):
                break
        out = b'{"length": %d, "ok"}' % n
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-length", b"%d" % len(out))]})
        await send({"type": "http.response.body", "body": out})

    async def main():
        kind = FrontServer if front else HttpServer
        server = kind(app, port=port, reuse_port=False, header_timeout_s=header_timeout_s)
        await server.start()
        print("ready", flush=True)
        await asyncio.Event().wait()

    uvloop.run(main())


def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def ordinary(port: int, n: int, gap_s: float) -> list[float]:
    """Latencies (s) of `n` requests, each on a connection of its own."""
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
            s.sendall(REQUEST)
            data = b""
            while not data.endswith(ANSWER_END):
                chunk = s.recv(4096)
                if not chunk:
                    raise RuntimeError(f"closed without an answer: {data!r}")
                data += chunk
        assert data.startswith(b"HTTP/1.1 200"), data[:100]
        out.append(time.perf_counter() - t0)
        time.sleep(gap_s)
    return out


def push(port: int, limit: int, pid: int) -> tuple[int, float, float]:
    """A client that pipelines and never reads: (bytes pushed, RSS before, RSS after)."""
    block = REQUEST * (65536 // len(REQUEST))
    before = rss_mib(pid)
    s = socket.create_connection(("127.0.0.1", port))
    s.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    s.setblocking(False)
    pushed, stalled = 0, None
    give_up = time.monotonic() + 60
    while pushed < limit and time.monotonic() < give_up:
        try:
            pushed += s.send(block[pushed % len(block):])
            stalled = None
        except BlockingIOError:
            stalled = stalled or time.monotonic()
            if time.monotonic() - stalled > 2:
                break
            time.sleep(0.005)
    time.sleep(0.5)
    after = rss_mib(pid)
    s.close()
    return pushed, before, after


def slowloris(port: int, n: int, seconds: float) -> tuple[list[float], list[float], dict]:
    base = ordinary(port, 50, 0.01)
    slow = [socket.create_connection(("127.0.0.1", port)) for _ in range(n)]
    head = b"GET / HTTP/1.1\r\nhost: a\r\nx-slow: " + b"a" * 10_000
    loaded: list[float] = []
    t_end = time.monotonic() + seconds
    i = 0
    while time.monotonic() < t_end:
        for s in slow:
            try:
                s.send(head[i:i + 1])
            except OSError:
                pass
        i += 1
        loaded += ordinary(port, 5, 0.02)
    got: dict[str, int] = {}
    for s in slow:
        s.settimeout(5)
        try:
            data = s.recv(200)
        except OSError:
            data = b""
        key = data.split(b"\r\n", 1)[0].decode() or "closed"
        got[key] = got.get(key, 0) + 1
        s.close()
    return base, loaded, got


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--slowloris", type=int, default=1000)
    parser.add_argument("--slow-seconds", type=float, default=12.0)
    parser.add_argument("--header-timeout", type=float, default=10.0)
    parser.add_argument("--push-mib", type=int, default=256)
    parser.add_argument("--front", action="store_true", help="through the native front")
    parser.add_argument("--serve", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        serve(args.serve, args.header_timeout, args.front)
        return
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "benchmarks.http.front_hostile", "--serve",
                             str(port), "--header-timeout", str(args.header_timeout),
                             *(["--front"] if args.front else [])],
                            stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        pushed, before, after = push(port, args.push_mib * 2**20, proc.pid)
        print(f"never-reading pipeliner: pushed {pushed / 2**20:.1f} MiB of {args.push_mib}; "
              f"server RSS {before:.1f} -> {after:.1f} MiB ({after - before:+.1f})")
        base, loaded, got = slowloris(port, args.slowloris, args.slow_seconds)
        p50 = statistics.median
        print(f"ordinary requests alone: p50 {p50(base) * 1e3:.2f} ms, max "
              f"{max(base) * 1e3:.2f} ms; beside {args.slowloris} slowloris heads: p50 "
              f"{p50(loaded) * 1e3:.2f} ms, max {max(loaded) * 1e3:.2f} ms "
              f"(delay p50 {(p50(loaded) - p50(base)) * 1e3:+.2f} ms)")
        print(f"the slow heads got: {got}; load {os.getloadavg()[0]:.2f}")
    finally:
        proc.kill()


if __name__ == "__main__":
    main()
