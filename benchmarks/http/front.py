"""In-process cost of the HTTP front: uvicorn + httptools + the app + a model that does
nothing, driven by `wrk` with a Lua body; no Ray, so what is measured is the front.

    python -m benchmarks.http.front                      # the raw ASGI OipApp, JSON and binary
    PYTHONPATH=<old checkout> python -m benchmarks.http.front --app fastapi   # the old ingress
    python -m benchmarks.http.front --app noop           # the floor: uvicorn and sockets
    python -m benchmarks.http.front --server raybatch    # Raybatch's own HTTP server, not uvicorn
    python -m benchmarks.http.front --server raybatch-front   # ... with its native front

`--app fastapi` rebuilds the FastAPI ingress as it was before `deployments/http`
(a Request, `request.body()`, `_guard`, `Response`) over whichever
`deployments.protocol` is importable, so an old checkout on PYTHONPATH gives the old
codec too (stdlib json). Prints, per body kind: requests/s and the server process's
CPU per request (user + system, from /proc), the figure that does not depend on how
busy the machine's other cores are.
"""


import argparse
import asyncio
import json
import os
import re
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from cluster.ports import free_port

MODEL, WIDTH = "mlp", 256
CLOCK = os.sysconf("SC_CLK_TCK")


# -- the server side -----------------------------------------------------------------------
def _spec() -> Any:
    from deployments.protocol import ModelSpec, TensorSpec

    return ModelSpec(MODEL, inputs=[TensorSpec("INPUT0", "FP32", [-1, WIDTH])],
                     outputs=[TensorSpec("OUTPUT0", "FP32", [-1, WIDTH])], max_batch_size=64)


def raw_app() -> Any:
    from deployments.http import HttpLimits, ModelEntry, OipApp

    entry = ModelEntry(MODEL, "1", _spec())

    class Backend:
        def models(self) -> list:
            return [entry]

        def model(self, name: str, version: str | None = None) -> Any:
            return entry

        async def infer(self, model: Any, request: Any, received_s: Any = None) -> dict:
            return {"OUTPUT0": request.inputs["INPUT0"]}

        def submit_infer(self, model: Any, request: Any, received_s: Any = None,
                         requests: int = 1) -> Any:
            future = asyncio.get_running_loop().create_future()  # the quick lane's way in
            future.set_result(request.inputs["INPUT0"])
            return future, lambda value: {"OUTPUT0": value}

    return OipApp(Backend(), HttpLimits())


def fastapi_app() -> Any:
    from fastapi import FastAPI, Request
    from fastapi.responses import Response

    from deployments.protocol import (
        check_content_length,
        encode_infer_response,
        error_body,
        parse_infer_request,
    )

    api = FastAPI(docs_url=None, redoc_url=None)
    spec, limit = _spec(), 64 * 2**20

    async def _guard(handler: Any) -> Response:
        try:
            return await handler()
        except Exception as e:
            return Response(error_body(str(e)), status_code=400, media_type="application/json")

    @api.post("/v2/models/{model}/infer")
    async def infer_http(model: str, request: Request) -> Response:
        async def infer() -> Response:
            check_content_length(request.headers, limit)
            body = await request.body()
            req = parse_infer_request(body, request.headers, spec, limit)
            outputs = {"OUTPUT0": req.inputs["INPUT0"]}
            out, headers = encode_infer_response(MODEL, "1", req.id, outputs,
                                                 req.outputs_requested, req.binary_data_output)
            return Response(out, headers=headers)
        return await _guard(infer)

    return api


async def noop_app(scope: dict, receive: Any, send: Any) -> None:
    """The floor: uvicorn and the sockets, an app that reads the body and answers 200."""
    if scope["type"] != "http":
        return
    while (await receive()).get("more_body"):
        pass
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"application/json"), (b"content-length", b"2")]})
    await send({"type": "http.response.body", "body": b"{}"})


def serve(app_kind: str, port: int, loop: str, server: str = "uvicorn") -> None:
    import uvicorn

    app = {"raw": raw_app, "fastapi": fastapi_app}[app_kind]() if app_kind != "noop" \
        else noop_app
    if server == "raybatch-front":
        return _serve_raybatch(app, port, loop, None, front=True)
    if server.startswith("raybatch"):
        quick = getattr(app, "quick", None) if server == "raybatch" else None
        return _serve_raybatch(app.direct if hasattr(app, "direct") else app, port, loop,
                               quick)
    uvicorn.run(app, host="127.0.0.1", port=port, http="httptools", loop=loop,
                log_level="warning", access_log=False, lifespan="off")


def _serve_raybatch(app: Any, port: int, loop: str, quick: Any, front: bool = False) -> None:
    from deployments.http.native.front import FrontServer
    from deployments.http.pyserver.server import HttpServer

    async def main() -> None:
        if front:  # the OIP app itself: the front learns from its quick lane
            await FrontServer(app, port=port).start()
        else:
            await HttpServer(app, port=port, quick=quick).start()
        await asyncio.Event().wait()

    if loop == "uvloop":
        import uvloop

        uvloop.run(main())
    else:
        asyncio.run(main())


# -- the client side -----------------------------------------------------------------------
def body_of(kind: str) -> tuple[bytes, dict[str, str]]:
    x = np.random.default_rng(0).standard_normal((1, WIDTH)).astype(np.float32)
    if kind == "json":
        doc = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, WIDTH],
                           "data": x.ravel().tolist()}]}
        return json.dumps(doc).encode(), {"Content-Type": "application/json"}
    raw = x.tobytes()
    head = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1, WIDTH],
                                   "parameters": {"binary_data_size": len(raw)}}],
                       "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]}
                      ).encode()
    return head + raw, {"Content-Type": "application/octet-stream",
                        "Inference-Header-Content-Length": str(len(head))}


def lua_script(body: bytes, headers: dict[str, str]) -> str:
    escaped = "".join(f"\\{b:03d}" for b in body)
    lines = ['wrk.method = "POST"', f'wrk.body = "{escaped}"']
    lines += [f'wrk.headers["{k}"] = "{v}"' for k, v in headers.items()]
    return "\n".join(lines) + "\n"


def rss_mib(pid: int) -> float:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLOCK


def wait_up(port: int, timeout_s: float = 30.0) -> None:
    give_up = time.monotonic() + timeout_s
    while time.monotonic() < give_up:
        try:
            socket.create_connection(("127.0.0.1", port), 0.2).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"the server on port {port} did not come up")


def run_wrk(url: str, script: str, connections: int, duration_s: int) -> dict[str, float]:
    out = subprocess.run(["wrk", "-t1", f"-c{connections}", f"-d{duration_s}s", "-s", script,
                          url], capture_output=True, text=True, check=True).stdout
    requests = int(re.search(r"(\d+) requests in", out).group(1))
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    return {"requests": requests, "non_2xx": int(errors.group(1)) if errors else 0}


def measure(app_kind: str, body_kind: str, connections: int, duration_s: int,
            loop: str, server_kind: str = "uvicorn") -> dict[str, Any]:
    port = free_port()
    server = subprocess.Popen([sys.executable, __file__, "--serve", app_kind, "--port",
                               str(port), "--loop", loop, "--server", server_kind])
    try:
        wait_up(port)
        body, headers = body_of(body_kind)
        url = f"http://127.0.0.1:{port}/v2/models/{MODEL}/infer"
        with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
            f.write(lua_script(body, headers))
        run_wrk(url, f.name, connections, 2)  # warm-up
        rss0, before, t0 = rss_mib(server.pid), cpu_s(server.pid), time.monotonic()
        got = run_wrk(url, f.name, connections, duration_s)
        used, wall = cpu_s(server.pid) - before, time.monotonic() - t0
        rss1 = rss_mib(server.pid)
        os.unlink(f.name)
    finally:
        server.terminate()
        server.wait(10)
    n = got["requests"]
    return {"app": app_kind, "server": server_kind, "body": body_kind, "requests": n,
            "non_2xx": got["non_2xx"],
            "req_per_s": round(n / wall), "server_cpu_us_per_request": round(used / n * 1e6, 1),
            "server_rss_mib": [round(rss0, 1), round(rss1, 1)]}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--app", choices=["raw", "fastapi", "noop"], default="raw")
    p.add_argument("--body", choices=["json", "binary", "both"], default="both")
    p.add_argument("--connections", type=int, default=64)
    p.add_argument("--duration", type=int, default=10)
    p.add_argument("--loop", choices=["uvloop", "asyncio"], default="uvloop")
    p.add_argument("--server", choices=["uvicorn", "raybatch", "raybatch-asgi", "raybatch-front",
                                        "both", "all"],
                   default="uvicorn",
                   help="the HTTP server: uvicorn (as under Serve), "
                        "deployments.http.pyserver.server (raybatch: with the app's quick lane; "
                        "raybatch-asgi: every request "
                        "through the ASGI app), both (uvicorn, raybatch) or all three")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--serve", choices=["raw", "fastapi", "noop"], help=argparse.SUPPRESS)
    p.add_argument("--port", type=int, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.serve:
        return serve(args.serve, args.port, args.loop, args.server)
    servers = {"both": ["uvicorn", "raybatch"], "all": ["uvicorn", "raybatch-asgi", "raybatch"]
               }.get(args.server, [args.server])
    for _ in range(args.repeats):
        for body in (["json", "binary"] if args.body == "both" else [args.body]):
            for server in servers:  # alternated: the machine's load drifts between runs
                print(json.dumps(measure(args.app, body, args.connections, args.duration,
                                         args.loop, server)), flush=True)


if __name__ == "__main__":
    asyncio.set_event_loop_policy(None)
    main()
