"""`raybatch demo`: a demo model behind the embedded `BatchedService`, under closed-loop load.

It shows what the engine does before any Ray is involved: C clients each send
one item at a time; the batcher turns them into batches; the report gives
throughput, latency and why batches were sent.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import numpy as np

from batching import BatchedService, DynamicPolicy

MODELS = {"square": "Square", "mlp": "MLP", "sleep": "Sleep"}


def _payload(model: str, rng: np.random.Generator) -> object:
    if model == "mlp":
        return rng.standard_normal(256, dtype=np.float32)
    return float(rng.integers(0, 100))


async def _load(args: argparse.Namespace) -> dict:
    from deployments import models

    policy = DynamicPolicy(max_batch_size=args.max_batch_size,
                           max_queue_delay_s=args.max_queue_delay_ms / 1e3)
    latencies: list[float] = []
    async with BatchedService(getattr(models, MODELS[args.model]), policy=policy) as svc:
        stop = time.perf_counter() + args.seconds
        rng = np.random.default_rng(0)

        async def client() -> None:
            while time.perf_counter() < stop:
                t0 = time.perf_counter()
                await svc.submit(_payload(args.model, rng))
                latencies.append(time.perf_counter() - t0)

        t0 = time.perf_counter()
        await asyncio.gather(*(client() for _ in range(args.concurrency)))
        elapsed = time.perf_counter() - t0
        stats = svc.stats()
    lat = np.array(latencies) * 1e3
    return {"requests": len(lat), "rps": len(lat) / elapsed,
            "p50_ms": float(np.percentile(lat, 50)), "p99_ms": float(np.percentile(lat, 99)),
            "stats": stats}


def run_demo(args: argparse.Namespace) -> int:
    print(f"raybatch demo: model={args.model}, {args.concurrency} clients "
          f"for {args.seconds:.0f} s, "
          f"max_batch_size={args.max_batch_size}, max_queue_delay={args.max_queue_delay_ms} ms")
    r = asyncio.run(_load(args))
    s = r["stats"]
    print(f"  {r['requests']} requests, {r['rps']:.0f} requests/s, "
          f"p50 {r['p50_ms']:.2f} ms, p99 {r['p99_ms']:.2f} ms")
    print(f"  {s['batches']} batches, mean size {s['mean_batch_size']:.1f}, "
          f"sent because: {s['by_reason']}")
    lm = s["latency_model"]
    print(f"  learned batch latency: {lm['a_ms']:.3f} ms + {lm['b_ms_per_cost']:.4f} ms/item")
    return 0
