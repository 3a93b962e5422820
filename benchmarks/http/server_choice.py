"""Which HTTP server the ingress should run: Raybatch's own against granian's embedded one.

Each server runs alone in a process shaped like an ingress replica (one process, uvloop)
and answers every POST with a fixed JSON body once it has read the request's body,
from a later loop callback as the engine does; `wrk` (one thread, 128 connections)
posts the `mlp` JSON body. Reported: req/s and the server process's CPU per request,
the figure the choice rests on (what is left per request for the codec, the route and
the engine). The servers alternate, `--rounds` times.

    .peers/venv/bin/pip install granian==2.8.7 uvloop   # granian stays out of the project
    python -m benchmarks.http.server_choice --granian-python .peers/venv/bin/python

Measured 2026-11-26 on the 2-core machine: before the server's hardening (load 1–1.8),
own 14.0–14.6 µs a request (67–71k req/s), granian 2.8.7 (RSGI, hyper) 22.3–23.5 µs
(51–56k req/s); with it (load 0.8–0.9), own 16.2–18.2 µs (55–61k req/s), granian
23.2–24.9 µs (48–50k req/s).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ANSWER = b'{"model_name":"mlp","outputs":[]}'

_SERVER = r'''
import asyncio, sys
import uvloop
KIND, PORT = sys.argv[1], int(sys.argv[2])
ANSWER = ANSWER_BYTES

async def main():
    loop = asyncio.get_running_loop()
    if KIND == "own":
        from deployments.http.pyserver.server import HttpServer

        async def asgi(scope, receive, send):  # every POST with a length takes the quick lane
            await send({"type": "http.response.start", "status": 404, "headers": []})
            await send({"type": "http.response.body", "body": b""})

        def quick(cycle):
            cycle.whole_body()
            loop.call_soon(cycle.respond, 200, [(b"content-type", b"application/json")],
                           [ANSWER])
            return True
        server = HttpServer(asgi, port=PORT, reuse_port=False, quick=quick)
        await server.start()
        print("ready", flush=True)
        await asyncio.Event().wait()
    else:
        from granian.constants import Interfaces
        from granian.server.embed import Server

        async def app(scope, proto):
            await proto()
            fut = loop.create_future()
            loop.call_soon(fut.set_result, None)
            await fut
            proto.response_bytes(200, [("content-type", "application/json")], ANSWER)
        print("ready", flush=True)
        await Server(app, address="127.0.0.1", port=PORT, interface=Interfaces.RSGI,
                     log_enabled=False, backlog=2048).serve()

uvloop.run(main())
'''.replace("ANSWER_BYTES", repr(ANSWER))


def cpu_s(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure(python: str, kind: str, port: int, seconds: float) -> tuple[float, float]:
    """(req/s, server CPU µs per request) of one server."""
    from benchmarks.common.wrk import run_wrk

    with tempfile.NamedTemporaryFile("w", suffix=".py", delete=False) as f:
        f.write(_SERVER)
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([python, f.name, kind, str(port)], stdout=subprocess.PIPE,
                            text=True, env=env)
    try:
        assert proc.stdout.readline().strip() == "ready", f"{kind} did not start"
        body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, 256],
                                       "data": [0.5] * 256}]}).encode()
        url = f"http://127.0.0.1:{port}/v2/models/mlp/infer"
        headers = {"Content-Type": "application/json"}
        for _ in range(50):  # the port may take a moment to answer
            try:
                run_wrk(url, body, headers, connections=1, duration_s=1)
                break
            except RuntimeError:
                time.sleep(0.1)
        c0 = cpu_s(proc.pid)
        r = run_wrk(url, body, headers, connections=128, duration_s=seconds)
        used = cpu_s(proc.pid) - c0
        if r.errors:
            raise RuntimeError(f"{kind}: {r.first_error}")
        return r.throughput_rps, used / r.requests * 1e6
    finally:
        proc.kill()
        proc.wait()
        os.unlink(f.name)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--granian-python", required=True,
                        help="a Python with granian and uvloop installed (not the project's)")
    parser.add_argument("--seconds", type=float, default=6.0)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--port", type=int, default=18123)
    args = parser.parse_args()
    for _ in range(args.rounds):
        for kind, python in (("own", sys.executable), ("granian", args.granian_python)):
            rps, us = measure(python, kind, args.port, args.seconds)
            print(f"{kind:8} {rps:>9,.0f} req/s  {us:6.1f} us of server CPU a request  "
                  f"load {os.getloadavg()[0]:.2f}", flush=True)


if __name__ == "__main__":
    main()
