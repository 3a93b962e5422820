"""gRPC against HTTP on `mlp`: the same app, the same model, both through Serve's proxies.

    python -m benchmarks.http.grpc_vs_http [--concurrency 1 16 64] [--duration 10] [--rounds 2]
        [--no-wrk] [--json OUT]

One local Ray, one app (`mlp`, one replica on one CPU), Serve's HTTP proxy and its
gRPC proxy with the KServe v2 / Triton service. Each request is one item of 256
floats; bodies are built once before the runs, so clients pay for sending only:

- `http`: OIP over HTTP with the binary tensor extension both ways (what
  `tritonclient.http` sends with `binary_data=True`), aiohttp keep-alive connections;
- `grpc`: `ModelInfer` with `raw_input_contents` (what `tritonclient.grpc` sends),
  one grpc.aio channel, the generated stub;
- `http wrk`: the same HTTP body from `wrk` (C connections, one thread), a client that
  costs far less CPU than Python's, for the HTTP server's own ceiling.

The Python clients are driven closed-loop (C clients, `benchmarks.common.loadgen`); the
protocols alternate `--rounds` times. Reported per point: requests/s, p50/p99, and
CPU per request of the client and of each kind of Ray process (proxy, ingress,
batching actor, replica), from /proc. Others' work on a shared 2-core machine
moves absolute numbers; the ratios of one run are the result.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import re
import subprocess
import tempfile
import time
from typing import Any

import numpy as np

from benchmarks.common.loadgen import run_closed_loop
from benchmarks.common.results import save_json
from benchmarks.serve.drivers import HttpDriver, StatsPoller, http_body, tree_cpu_s

APP, PREFIX, MODEL = "grpcbench", "/grpcbench", "mlp"


def app_config() -> dict[str, Any]:
    return {"app_name": APP, "ingress": {"num_cpus": 0, "route_prefix": PREFIX},
            "models": [{
                "name": MODEL, "transformer": "deployments.models:MLP",
                "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 256]}],
                "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, 256]}],
                "batching": {"max_batch_size": 64, "max_queue_delay_s": 0.002},
                "replicas": {"min_replicas": 1, "max_replicas": 1, "num_cpus": 1,
                             "pin": "off"}}]}


def payloads(n: int = 64) -> list[np.ndarray]:
    return list(np.random.default_rng(0).standard_normal((n, 1, 256), dtype=np.float32))


class GrpcDriver:
    """`submit(request)` over one grpc.aio channel with the generated stub."""

    def __init__(self, target: str) -> None:
        self.target = target

    async def __aenter__(self) -> GrpcDriver:
        import grpc
        from tritonclient.grpc import service_pb2_grpc

        self.channel = grpc.aio.insecure_channel(self.target)
        self.stub = service_pb2_grpc.GRPCInferenceServiceStub(self.channel)
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.channel.close()

    async def submit(self, request: Any) -> Any:
        return await self.stub.ModelInfer(request, metadata=(("application", APP),))


def grpc_request(x: np.ndarray) -> Any:
    from tritonclient.grpc import service_pb2 as pb

    request = pb.ModelInferRequest(model_name=MODEL)
    request.inputs.add(name="INPUT0", datatype="FP32", shape=list(x.shape))
    request.raw_input_contents.append(x.astype("<f4").tobytes())
    return request


async def measure(protocol: str, driver: Any, bodies: list[Any], poller: StatsPoller,
                  concurrency: int, duration_s: float) -> dict[str, Any]:
    poller.edges.clear()
    r = await run_closed_loop(driver.submit, bodies, concurrency=concurrency,
                              duration_s=duration_s, warmup_s=1.0, stats=poller)
    server = poller.server_cpu_s() or {}
    return {"protocol": protocol, "rps": r.throughput_rps, "p50_ms": r.p50_ms,
            "p99_ms": r.p99_ms, "errors": r.errors, "first_error": r.first_error,
            "client_cpu_us_per_req": r.client_cpu_us_per_req,
            "server_cpu_us_per_req": {k: v / max(r.requests, 1) * 1e6
                                      for k, v in server.items() if v > 0.01},
            "mean_batch_size": r.mean_batch_size}


def wrk(url: str, body: bytes, headers: dict[str, str], concurrency: int,
        duration_s: float) -> dict[str, Any]:
    """`wrk` POSTing `body` (binary-safe: escaped into the Lua script)."""
    escaped = "".join(f"\\{b}" for b in body)
    lines = ['wrk.method = "POST"', f'wrk.body = "{escaped}"']
    lines += [f'wrk.headers["{k}"] = "{v}"' for k, v in headers.items()]
    with tempfile.NamedTemporaryFile("w", suffix=".lua", delete=False) as f:
        f.write("\n".join(lines) + "\n")
        script = f.name
    try:
        before = tree_cpu_s(os.getpid())
        out = subprocess.run(["wrk", "-t1", f"-c{concurrency}", f"-d{duration_s:.0f}s",
                              "--latency", "-s", script, url],
                             capture_output=True, text=True, timeout=duration_s + 60).stdout
        after = tree_cpu_s(os.getpid())
    finally:
        os.unlink(script)
    rps = float(re.search(r"Requests/sec:\s+([\d.]+)", out).group(1))
    errors = re.search(r"Non-2xx or 3xx responses: (\d+)", out)
    p50 = re.search(r"50%\s+([\d.]+)(us|ms|s)", out)
    p99 = re.search(r"99%\s+([\d.]+)(us|ms|s)", out)
    n = rps * duration_s
    return {"protocol": "http wrk", "rps": rps, "p50_ms": _ms(p50), "p99_ms": _ms(p99),
            "errors": int(errors.group(1)) if errors else 0,
            "server_cpu_us_per_req": {k: (after[k] - before.get(k, 0.0)) / n * 1e6
                                      for k in after
                                      if after[k] - before.get(k, 0.0) > 0.01}}


def _ms(m: Any) -> float:
    if m is None:
        return float("nan")
    value, unit = float(m.group(1)), m.group(2)
    return value / 1e3 if unit == "us" else value * 1e3 if unit == "s" else value


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    import ray
    from ray import serve

    from cluster.config import load_config
    from deployments.app import build_app
    from raybatch.serving import grpc_options

    ray.init(address="local", num_cpus=args.num_cpus, include_dashboard=False,
             log_to_driver=False)
    results: dict[str, Any] = {"settings": vars(args), "loadavg_start": os.getloadavg(),
                               "points": {}}
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": args.port},
                    grpc_options=grpc_options(args.grpc_port))
        handle = serve.run(build_app(load_config(app_config())), name=APP, route_prefix=PREFIX)
        xs = payloads()
        http_bodies = [http_body(x, binary=True) for x in xs]
        grpc_bodies = [grpc_request(x) for x in xs]
        url = f"http://127.0.0.1:{args.port}{PREFIX}/v2/models/{MODEL}/infer"

        async def fetch() -> dict[str, Any]:
            return (await handle.status.remote())[MODEL]

        async with StatsPoller(fetch) as poller:
            for c in args.concurrency:
                rows: list[dict[str, Any]] = []
                for _ in range(args.rounds):
                    async with HttpDriver(url, c) as http:
                        rows.append(await measure("http", http, http_bodies, poller, c,
                                                  args.duration))
                    async with GrpcDriver(f"127.0.0.1:{args.grpc_port}") as grpc_driver:
                        rows.append(await measure("grpc", grpc_driver, grpc_bodies, poller,
                                                  c, args.duration))
                    print(f"C={c}: {rows[-2]['rps']:.0f} http, {rows[-1]['rps']:.0f} grpc req/s",
                          flush=True)
                if args.wrk and c > 1:
                    body, headers = http_bodies[0]
                    rows.append(wrk(url, body, headers, c, args.duration))
                results["points"][str(c)] = summarize(rows)
    finally:
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: None)
        await serve.shutdown_async()
        ray.shutdown()
    results["loadavg_end"] = os.getloadavg()
    return results


def summarize(rows: list[dict[str, Any]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for protocol in dict.fromkeys(r["protocol"] for r in rows):
        mine = [r for r in rows if r["protocol"] == protocol]
        entry = {k: float(np.mean([r[k] for r in mine])) for k in ("rps", "p50_ms", "p99_ms")}
        entry["errors"] = sum(r["errors"] for r in mine)
        entry["per_round_rps"] = [round(r["rps"]) for r in mine]
        if "client_cpu_us_per_req" in mine[0]:
            entry["client_cpu_us_per_req"] = float(np.mean([r["client_cpu_us_per_req"]
                                                            for r in mine]))
        groups = {k for r in mine for k in r["server_cpu_us_per_req"]}
        entry["server_cpu_us_per_req"] = {
            k: round(float(np.mean([r["server_cpu_us_per_req"].get(k, 0.0) for r in mine])))
            for k in sorted(groups)}
        out[protocol] = entry
    out["grpc_over_http"] = out["grpc"]["rps"] / out["http"]["rps"]
    return out


def report(results: dict[str, Any]) -> str:
    lines = [f"{'C':>4} {'protocol':9} {'req/s':>8} {'p50 ms':>7} {'p99 ms':>7} "
             f"{'client us/req':>13}  server CPU us/req by process"]
    for c, point in results["points"].items():
        for protocol, p in point.items():
            if protocol == "grpc_over_http":
                continue
            server = ", ".join(f"{k.removeprefix('ray::')} {v}"
                               for k, v in p["server_cpu_us_per_req"].items())
            client = p.get("client_cpu_us_per_req", float("nan"))
            lines.append(f"{c:>4} {protocol:9} {p['rps']:8.0f} {p['p50_ms']:7.2f} "
                         f"{p['p99_ms']:7.2f} {client:13.0f}  {server}")
        lines.append(f"{c:>4} grpc / http (python clients): {point['grpc_over_http']:.2f}x")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--concurrency", type=int, nargs="+", default=[1, 16, 64])
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--no-wrk", dest="wrk", action="store_false")
    p.add_argument("--num-cpus", type=int, default=2)
    p.add_argument("--port", type=int, default=8124)
    p.add_argument("--grpc-port", type=int, default=9124)
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()
    t0 = time.perf_counter()
    results = asyncio.run(main_async(args))
    results["wall_s"] = time.perf_counter() - t0
    print(report(results))
    save_json(args.json, results)


if __name__ == "__main__":
    main()
