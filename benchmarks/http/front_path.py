"""CPU of Raybatch's own Python per HTTP request, in one process, without sockets or Ray.

    python -m benchmarks.http.front_path [--requests N] [--concurrency C] [--json-http]
        [--profile OUT.prof]

Drives the product path's app (`OipApp.direct`, as the direct-ingress fast path calls it)
with ASGI messages made in memory, through the real `ServeBackend` of a model with
`batcher.placement: ingress` and `idle_dispatch` (`ModelRoute`, `Signature`,
`LocalEngine`, `BatchHost`), whose one model replica is an in-process echo. What is
left out is what the real ingress adds around it: uvicorn/httptools (parsing, the
socket writes), Serve's middleware wrapper and the Ray call per batch. So the figure is
the part of the ingress's CPU that is Raybatch's own code, measured in a way that other
processes on the machine do not change (process CPU time / requests), and quick enough
to be run after each change. `--profile` writes a cProfile of the measured window.
"""

from __future__ import annotations

import argparse
import asyncio
import cProfile
import math
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from benchmarks.serve.drivers import http_body
from benchmarks.serve.models import bench_models, raybatch_config


class Echo:
    """A model replica that answers every batch at once with its inputs."""

    name = "echo-0"

    async def run(self, items: Any) -> tuple[Any, float]:
        await asyncio.sleep(0)
        return items, 0.0


class Stuck:
    """A model replica that never answers: the engine's queue only grows."""

    name = "stuck-0"

    async def run(self, items: Any) -> tuple[Any, float]:
        await asyncio.Event().wait()
        raise AssertionError("unreachable")


def build_app(model: str = "mlp", replica: Any = None) -> Any:
    from cluster.config import load_config
    from deployments.batcher.hosts import make_host
    from deployments.http import HttpLimits, OipApp
    from deployments.ingress.deployment import ServeBackend

    config = load_config(raybatch_config(bench_models()[model], "bench", "/",
                                         "ingress+idle"))
    backend = ServeBackend(config)
    for m in backend.by_name.values():
        engine = m.placement.engine
        engine.host = make_host(engine.config, on_replica_died=lambda c: None)
        engine.host.add_replica(replica or Echo())
        engine._started = asyncio.get_running_loop().create_future()
        engine._started.set_result(None)
    return OipApp(backend, HttpLimits.from_config(config.ingress))


def scope(model: str, headers: dict[str, str], size: int) -> dict[str, Any]:
    raw = [(b"host", b"127.0.0.1:8000"), (b"user-agent", b"wrk"),
           (b"content-length", str(size).encode())]
    raw += [(k.lower().encode(), v.encode()) for k, v in headers.items()]
    return {"type": "http", "asgi": {"version": "3.0"}, "http_version": "1.1",
            "method": "POST", "scheme": "http", "path": f"/v2/models/{model}/infer",
            "raw_path": f"/v2/models/{model}/infer".encode(), "query_string": b"",
            "root_path": "", "headers": raw, "client": ("127.0.0.1", 40000),
            "server": ("127.0.0.1", 8000), "state": {}}


async def drive(app: Any, sc: dict[str, Any], body: bytes, total: int, c: int) -> list[int]:
    message = {"type": "http.request", "body": body, "more_body": False}
    statuses: list[int] = []

    async def receive() -> dict[str, Any]:
        return message

    async def send(m: dict[str, Any]) -> None:
        if m["type"] == "http.response.start":
            statuses.append(m["status"])

    left = [total]

    async def client() -> None:
        while left[0] > 0:
            left[0] -= 1
            await app.direct(dict(sc), receive, send)

    await asyncio.gather(*(client() for _ in range(c)))
    return statuses


async def main_async(args: argparse.Namespace) -> None:
    app = build_app(args.model)
    x = np.random.default_rng(0).standard_normal((1, 256), dtype=np.float32)
    body, headers = http_body(x, not args.json_http)
    sc = scope(args.model, headers, len(body))
    await drive(app, sc, body, 2000, args.concurrency)  # warm up

    async def window() -> int:
        statuses = await drive(app, sc, body, args.requests, args.concurrency)
        return sum(s != 200 for s in statuses)

    await best_of(window, args.repeats, args.requests,
                  f"C={args.concurrency}, {'JSON' if args.json_http else 'binary'}",
                  args.profile)


async def best_of(window: Callable[[], Awaitable[int]], repeats: int, requests: int,
                  label: str, profile: str | None = None) -> float:
    """Run `window` (`requests` requests through the path; returns how many failed)
    `repeats` times, print each one's CPU per request and return the best (us); with
    `profile`, a cProfile of the windows is written there."""
    prof = cProfile.Profile() if profile else None
    best = math.inf
    for _ in range(repeats):
        if prof:
            prof.enable()
        t0, c0 = time.perf_counter(), time.process_time()
        failed = await window()
        cpu, wall = time.process_time() - c0, time.perf_counter() - t0
        if prof:
            prof.disable()
        if failed:
            raise SystemExit(f"{failed} of {requests} requests failed")
        us = cpu / requests * 1e6
        best = min(best, us)
        print(f"{requests} requests, {label}: {us:6.1f} us CPU/request, "
              f"{requests / wall:8,.0f} req/s")
    print(f"best: {best:.1f} us CPU/request")
    if prof:
        prof.dump_stats(profile)
    return best


def window_arguments(doc: str, model: str) -> argparse.ArgumentParser:
    """The options every in-process path benchmark takes (`best_of`'s windows)."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument("--model", default=model, choices=("mlp", "sleep"))
    ap.add_argument("--requests", type=int, default=20_000)
    ap.add_argument("--concurrency", type=int, default=128)
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--profile", metavar="OUT")
    return ap


def main() -> None:
    ap = window_arguments(__doc__, "mlp")
    ap.add_argument("--json-http", action="store_true")
    asyncio.run(main_async(ap.parse_args()))


if __name__ == "__main__":
    main()
