"""What Raybatch's metrics cost: the same app with and without them, on the client path
(`RaybatchClient`) and on the HTTP path (`wrk` at the ingress replica's fast path).

    python -m benchmarks.serve.metrics_overhead [--models square sleep] [--paths client http]
        [--concurrency 128] [--rounds 10] [--duration 2] [--warmup 0.5]
        [--placement ingress|actor] [--json OUT]
    python -m benchmarks.serve.metrics_overhead --micro     # the actor's recording alone, no Ray

One local Ray, Serve throughput-optimized with direct ingress as in
`benchmarks.serve.compare`. Per model, two Raybatch apps side by side, identical
but for `metrics.enabled` (`metrics-on`, `metrics-off`), each one ingress replica
(the engine where `batcher.placement` puts it: the ingress, by default, for a
one-shard dynamic model). Per path, each variant is driven in turn, closed-loop at
C (ABBA rounds, so drift and the other helpers' load fall on both alike): the
client path by `RaybatchClient`, the HTTP path by `wrk` (C connections, JSON
bodies, a warm-up second first) at the ingress replica's own port, where every
response is counted for `raybatch_http_requests_total`. The run prints each
round's throughput, the median ratio on/off, and the CPU per request of the
client (wrk's own, for HTTP) and of each kind of Ray process (batching actor,
model replica, ingress, raylet...), whose difference on/off is what the metrics
cost, less noisy than throughput on a shared box. Ray exports metrics at its
default interval (10 s); the batching actor samples every `metrics.interval_s`
(1 s). `square` (no compute) is the worst case: the most requests per second, so
the most recording per second.

`--micro` times what metrics add to the batching actor's hot path by itself:
`BatcherMetrics.batch_sent` + `batch_done` per batch (all a batch costs it; the
Ray calls happen once per `metrics.interval_s`), per request, for batches of 1,
8 and 64 requests. On a shared box it is the steadier figure.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from typing import Any

import numpy as np

from benchmarks.common.results import save_json
from benchmarks.serve.models import MAX_BATCH_SIZE, bench_models, raybatch_config
from benchmarks.serve.settings import FULL, configure_environment

VARIANTS = ("metrics-on", "metrics-off")


def square_config() -> dict[str, Any]:
    return {"name": "square", "transformer": "deployments.models:Square",
            "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1]}],
            "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1]}],
            "batching": {"max_batch_size": MAX_BATCH_SIZE, "max_queue_delay_s": 0.002},
            "replicas": {"min_replicas": 1, "max_replicas": 1, "num_cpus": 0.5}}


def app_config(model: str, variant: str, placement: str | None = None) -> dict[str, Any]:
    """The config of one app: `model` alone, metrics on or off."""
    if model == "square":
        base = {"app_name": "x", "ingress": {"num_replicas": 1, "num_cpus": 0.5},
                "models": [square_config()]}
    else:
        base = raybatch_config(bench_models()[model], "x", "/x")
    if placement:
        base["models"] = [{**m, "batcher": {**m.get("batcher", {}), "placement": placement}}
                          for m in base["models"]]
    return {**base, "app_name": f"{variant}-{model}",
            "ingress": {**base["ingress"], "route_prefix": f"/{variant}-{model}"},
            "metrics": {"enabled": variant == "metrics-on"}}


def payloads(model: str) -> list[np.ndarray]:
    if model == "square":
        return [np.full(1, i, dtype=np.float32) for i in range(64)]
    return bench_models()[model].payloads(64)


async def drive(client: Any, model: str, args: argparse.Namespace) -> dict[str, float]:
    from benchmarks.common.loadgen import run_closed_loop
    from benchmarks.serve.drivers import StatsPoller

    async def submit(x: np.ndarray) -> Any:
        return await client.infer(model, {"INPUT0": x})

    async def nothing() -> dict[str, Any]:  # the poller is here for its CPU edges only
        return {}

    async with StatsPoller(nothing, every_s=1.0) as poller:
        r = await run_closed_loop(submit, payloads(model), concurrency=args.concurrency,
                                  duration_s=args.duration, warmup_s=args.warmup,
                                  stats=poller)
    if r.errors:
        raise RuntimeError(f"{r.errors} errors, first: {r.first_error}")
    n = max(r.requests, 1)
    by_title = {k: v / n * 1e6 for k, v in (poller.server_cpu_s() or {}).items()}
    return point(r, by_title)


def point(r: Any, by_title: dict[str, float]) -> dict[str, float]:
    """One measured point: throughput, latency, and CPU per request by process group."""
    out = {"rps": r.throughput_rps, "p50_ms": r.p50_ms, "p99_ms": r.p99_ms,
           "client_us_per_req": r.client_cpu_us_per_req,
           "ray_us_per_req": sum(by_title.values())}
    out.update({f"cpu_us:{group(k)}": 0.0 for k in by_title})
    for k, v in by_title.items():
        out[f"cpu_us:{group(k)}"] += v
    return out


async def drive_http(url: str, model: str, args: argparse.Namespace) -> dict[str, float]:
    """One wrk run at `url` (a warm-up second first): throughput, latency, CPU per request."""
    from benchmarks.common.wrk import run_wrk
    from benchmarks.serve.drivers import http_body, tree_cpu_s

    body, headers = http_body(payloads(model)[0], binary=False)
    await asyncio.to_thread(run_wrk, url, body, headers, connections=args.concurrency,
                            duration_s=1)
    cpu0 = tree_cpu_s(os.getpid())
    r = await asyncio.to_thread(run_wrk, url, body, headers, connections=args.concurrency,
                                duration_s=args.duration)
    cpu1 = tree_cpu_s(os.getpid())
    if r.errors:
        raise RuntimeError(f"{r.errors} errors of {r.requests} wrk requests at {url}")
    n = max(r.requests, 1)
    by_title = {k: (cpu1[k] - cpu0.get(k, 0.0)) / n * 1e6 for k in cpu1
                if cpu1[k] - cpu0.get(k, 0.0) > 0 and "wrk" not in k}
    return point(r, by_title)


def group(title: str) -> str:
    """A Ray process title as the part of Raybatch (or Ray) it is."""
    for key, name in (("BatcherActor", "batching actor"), ("Replica:", "ingress"),
                      ("ModelReplica", "model replica"), ("raylet", "raylet"),
                      ("gcs", "gcs")):
        if key in title:
            return name
    return "other Ray"


async def measure(model: str, args: argparse.Namespace) -> dict[str, Any]:
    """Per path: every round's figures of both variants, and their summary."""
    from ray import serve

    from benchmarks.serve.drivers import http_url
    from cluster.config import load_config
    from deployments.app import build_app
    from deployments.ingress.client import RaybatchClient

    configs = {v: load_config(app_config(model, v, args.placement)) for v in VARIANTS}
    clients, urls = {}, {}
    for v, c in configs.items():
        handle = serve.run(build_app(c), name=c.app_name, route_prefix=c.ingress.route_prefix)
        clients[v] = RaybatchClient(handle)
        urls[v] = await http_url(c.app_name, c.ingress.route_prefix, model, args.port,
                                 direct=True)
    out = {}
    for path in args.paths:
        rounds: list[dict[str, dict[str, float]]] = []
        for i in range(args.rounds):
            order = VARIANTS if i % 2 == 0 else VARIANTS[::-1]  # ABBA: drift hits both alike
            rounds.append({v: await (drive(clients[v], model, args) if path == "client"
                                     else drive_http(urls[v], model, args)) for v in order})
            on, off = rounds[-1]["metrics-on"], rounds[-1]["metrics-off"]
            print(f"  {model} {path} round {i + 1}: on {on['rps']:8.0f} req/s   off "
                  f"{off['rps']:8.0f} req/s   on/off {on['rps'] / off['rps']:.3f}", flush=True)
        out[path] = {"rounds": rounds, **summary(rounds)}
    for c in configs.values():
        serve.delete(c.app_name)
    return out


def summary(rounds: list[dict[str, dict[str, float]]]) -> dict[str, Any]:
    ratios = [r["metrics-on"]["rps"] / r["metrics-off"]["rps"] for r in rounds]
    med = {v: {k: statistics.median(r[v].get(k, 0.0) for r in rounds)
               for k in sorted({k for r in rounds for k in r[v]})} for v in VARIANTS}
    return {"ratio_median": statistics.median(ratios), "ratio_min": min(ratios),
            "ratio_max": max(ratios), "median": med}


def render(model: str, path: str, s: dict[str, Any], c: int) -> str:
    on, off = s["median"]["metrics-on"], s["median"]["metrics-off"]
    driver = "RaybatchClient" if path == "client" else "HTTP fast path, wrk (client: wrk)"
    lines = [f"{model}, {driver}, C={c}, medians of {len(s['rounds'])} rounds:",
             f"  {'':12s} {'req/s':>9s} {'p50 ms':>8s} {'p99 ms':>8s} {'client us/req':>14s} "
             f"{'Ray us/req':>11s}"]
    for name, m in (("metrics on", on), ("metrics off", off)):
        lines.append(f"  {name:12s} {m['rps']:9.0f} {m['p50_ms']:8.2f} {m['p99_ms']:8.2f} "
                     f"{m['client_us_per_req']:14.1f} {m['ray_us_per_req']:11.1f}")
    lines.append(f"  throughput on/off: median {s['ratio_median']:.3f} (rounds "
                 f"{s['ratio_min']:.3f}..{s['ratio_max']:.3f}), i.e. "
                 f"{(1 - s['ratio_median']) * 100:+.1f}% with metrics")
    lines.append("  CPU us per request, median (on / off / on-off):")
    groups = sorted(k for k in on if k.startswith("cpu_us:"))
    for k in ["client_us_per_req", *groups]:
        lines.append(f"    {k.removeprefix('cpu_us:'):18s} {on[k]:7.1f} / {off.get(k, 0):7.1f} "
                     f"/ {on[k] - off.get(k, 0):+6.1f}")
    total_on = on["client_us_per_req"] + on["ray_us_per_req"]
    total_off = off["client_us_per_req"] + off["ray_us_per_req"]
    lines.append(f"    {'all':18s} {total_on:7.1f} / {total_off:7.1f} / "
                 f"{total_on - total_off:+6.1f} ({(total_on / total_off - 1) * 100:+.1f}%)")
    return "\n".join(lines)


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    import ray
    from ray import serve

    ray.init(address="local", include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": args.port})
        return {m: await measure(m, args) for m in args.models}
    finally:
        serve.shutdown()
        ray.shutdown()


def micro(sizes: tuple[int, ...] = (1, 8, 64), batches: int = 50_000) -> str:
    """Microseconds the batching actor spends recording, per batch and per request."""
    from batching.metrics import BatchDone, BatchSent
    from cluster.config import ModelConfig
    from deployments.metrics import BatcherMetrics

    m = BatcherMetrics(ModelConfig.model_validate(square_config()))
    lines = ["batching actor, recording per batch (BatcherMetrics.batch_sent + batch_done):"]
    for size in sizes:
        sent = BatchSent(size, float(size), "full", (0.0012,) * size, (1,) * size)
        done = BatchDone(size, 0.003, 0.002)
        best = float("inf")
        for _ in range(5):  # best of 5: the least disturbed by the other processes here
            t0 = time.perf_counter()
            for _ in range(batches):
                m.batch_sent(sent)
                m.batch_done(done)
            best = min(best, (time.perf_counter() - t0) / batches)
        lines.append(f"  {size:3d} requests per batch: {best * 1e6:6.2f} us per batch, "
                     f"{best / size * 1e6:5.2f} us per request")
    return "\n".join(lines)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", nargs="+", default=["square", "sleep"],
                   choices=["square", "sleep", "mlp"])
    p.add_argument("--paths", nargs="+", default=["client", "http"], choices=["client", "http"])
    p.add_argument("--placement", choices=["ingress", "actor"],
                   help="where the engine runs (default: the config's default for the model)")
    p.add_argument("--concurrency", type=int, default=128)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--duration", type=float, default=2.0)
    p.add_argument("--warmup", type=float, default=0.5)
    p.add_argument("--micro", action="store_true",
                   help="time the batching actor's recording alone (no Ray cluster)")
    p.add_argument("--port", type=int, default=8100)
    p.add_argument("--json", help="write the results here")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.micro:
        print(micro())
        return
    configure_environment(FULL)
    t0 = time.perf_counter()
    results = asyncio.run(main_async(args))
    for model, by_path in results.items():
        for path, s in by_path.items():
            print(render(model, path, s, args.concurrency))
    print(f"wall {time.perf_counter() - t0:.0f} s")
    save_json(args.json, results)


if __name__ == "__main__":
    main()
