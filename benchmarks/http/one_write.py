"""What one socket write per response would save under uvicorn + httptools: a probe.

    python -m benchmarks.http.one_write [--loop uvloop|asyncio] [--repeats 4] [--duration 4]

uvicorn's httptools protocol writes the status line and headers when the app sends
`http.response.start` (`transport.write`, httptools_impl.py:524 in uvicorn 0.54) and the
body when it sends `http.response.body` (:551): two send() calls per response, and
nothing in ASGI or in how Ray Serve starts uvicorn (`serve/_private/http_util.py:
start_asgi_http_server`: `uvicorn.Config(...)` with the default `http="auto"`, no
protocol class of ours) lets an app join them. This probe measures what joining would
buy, on the floor (an app that answers `{}`), in one uvicorn process driven by wrk:
`two` is uvicorn as it is; `joined` holds the header write back and sends it with the
body, by wrapping the connection's transport, a private attribute of uvicorn's
`RequestResponseCycle` (`send.__self__.transport`). That wrapper is the monkeypatch
Raybatch does not ship: it is here only to measure. Prints the server's CPU per request
(user + system, /proc) and requests/s, alternating the two, and their medians.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any

from benchmarks.http import front as hf


class _Joining:
    """A transport whose first write waits for the second (headers, then body)."""

    __slots__ = ("pending", "transport")

    def __init__(self, transport: Any) -> None:
        self.transport, self.pending = transport, None

    def write(self, data: bytes) -> None:
        if self.pending is None:
            self.pending = data
        else:
            self.transport.write(self.pending + data)
            self.pending = None

    def __getattr__(self, name: str) -> Any:
        return getattr(self.transport, name)


async def joined_app(scope: dict, receive: Any, send: Any) -> None:
    if scope["type"] != "http":
        return
    cycle = send.__self__  # uvicorn's RequestResponseCycle: private
    if type(cycle.transport) is not _Joining:
        cycle.transport = _Joining(cycle.transport)
    await hf.noop_app(scope, receive, send)


def serve(kind: str, port: int, loop: str) -> None:
    import uvicorn

    uvicorn.run(hf.noop_app if kind == "two" else joined_app, host="127.0.0.1", port=port,
                http="httptools", loop=loop, log_level="warning", access_log=False,
                lifespan="off")


def measure(kind: str, loop: str, duration_s: int) -> dict[str, Any]:
    port = hf.free_port()
    server = subprocess.Popen([sys.executable, "-m", "benchmarks.http.one_write", "--serve", kind,
                               "--port", str(port), "--loop", loop])
    try:
        hf.wait_up(port)
        body, headers = hf.body_of("binary")
        with tempfile.NamedTemporaryFile("w", suffix=".lua") as f:
            f.write(hf.lua_script(body, headers))
            f.flush()
            url = f"http://127.0.0.1:{port}/v2/models/{hf.MODEL}/infer"
            hf.run_wrk(url, f.name, 128, 1)
            before, t0 = hf.cpu_s(server.pid), time.monotonic()
            got = hf.run_wrk(url, f.name, 128, duration_s)
            used, wall = hf.cpu_s(server.pid) - before, time.monotonic() - t0
    finally:
        server.terminate()
        server.wait(10)
    n = got["requests"]
    return {"kind": kind, "loop": loop, "req_per_s": round(n / wall),
            "cpu_us_per_req": round(used / n * 1e6, 1), "non_2xx": got["non_2xx"]}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--loop", choices=("uvloop", "asyncio"), default="uvloop",
                    help="uvloop: what a Ray actor (a Serve replica) runs on")
    ap.add_argument("--repeats", type=int, default=4)
    ap.add_argument("--duration", type=int, default=4)
    ap.add_argument("--serve", choices=("two", "joined"), help=argparse.SUPPRESS)
    ap.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.serve:
        return serve(args.serve, args.port, args.loop)
    rows = []
    for _ in range(args.repeats):
        for kind in ("two", "joined"):
            rows.append(measure(kind, args.loop, args.duration))
            print(json.dumps(rows[-1]), flush=True)
    for kind in ("two", "joined"):
        mine = [r for r in rows if r["kind"] == kind]
        print(f"{kind:<7} median {statistics.median(r['cpu_us_per_req'] for r in mine):6.1f} "
              f"us CPU/request, {statistics.median(r['req_per_s'] for r in mine):8,.0f} req/s")


if __name__ == "__main__":
    main()
