"""How busy one model-replica actor stays when the engine keeps its pipeline full.

    python -m benchmarks.placement.replica_pipeline [--model sleep|mlp] [--batches N]
        [--batch-size B] [--inflight K ...] [--read-ahead on off]

One replica actor of `model` (`replicas.in_process: false`, as GPU models run), fed
by K callers that each send the next batch of B single-row arrays as soon as their last
one returns, so K batches are always in flight, as the engine keeps
`replicas.max_inflight_batches` of them. Printed per K: batches/s, and the replica's
busy fraction (the compute time it reports, summed, over the wall time). With the
pipeline full, anything below 1 is time the model waited for Ray between two batches:
reading the next batch's arguments and writing the last one's results, which a replica
with `replicas.read_ahead` overlaps with its model (`deployments.replica.actor`); each K runs
with it on and off, alternated. No HTTP, no engine: the number is the replica actor's
own. (This process makes and reads every batch: with a fast CPU model it, not the
replica, sets the pace, and busy stays well below 1 either way.)
"""

from __future__ import annotations

import argparse
import asyncio
import time
from typing import Any

import numpy as np

from benchmarks.serve.models import bench_models


async def measure(model: str, batches: int, batch_size: int, inflight: int,
                  read_ahead: bool) -> dict[str, Any]:
    """One replica actor, `batches` batches with `inflight` of them always outstanding."""
    from cluster.config import ModelConfig
    from deployments.replica.pool import ReplicaPool

    bench = bench_models()[model]
    m = bench.config.model_dump(mode="json")
    m["replicas"] = {**m["replicas"], "in_process": False, "max_inflight_batches": inflight,
                     "read_ahead": read_ahead}
    config = ModelConfig.model_validate(m)
    read_ahead = config.replicas.reads_ahead()  # never with one batch in flight
    pool = ReplicaPool(config, host=None)
    _, client = pool._create()
    try:
        await client.info()  # built and warmed up
        items = bench.payloads(batch_size)
        for _ in range(3):
            await client.run(items)
        computes: list[float] = []
        sent = 0

        async def caller() -> None:
            nonlocal sent
            while sent < batches:
                sent += 1
                results, compute_s = await client.run(items)
                assert len(results) == len(items)
                computes.append(compute_s)

        t0 = time.perf_counter()
        await asyncio.gather(*(caller() for _ in range(inflight)))
        wall = time.perf_counter() - t0
    finally:
        client.stop()
    return {"model": model, "inflight": inflight, "read_ahead": read_ahead,
            "batch_size": batch_size,
            "batches": len(computes), "batches_per_s": len(computes) / wall,
            "busy": sum(computes) / wall, "mean_compute_ms": 1e3 * float(np.mean(computes))}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--model", choices=("sleep", "mlp"), default="sleep")
    ap.add_argument("--batches", type=int, default=400)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--inflight", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--read-ahead", nargs="+", choices=("on", "off"), default=["on", "off"])
    return ap.parse_args(argv)


async def main_async(args: argparse.Namespace) -> list[dict[str, Any]]:
    out = []
    for k, ahead in [(k, a) for k in args.inflight for a in args.read_ahead]:
        r = await measure(args.model, args.batches, args.batch_size, k, ahead == "on")
        print(f"{r['model']}, batches of {r['batch_size']}, {k} in flight, read ahead "
              f"{'on' if r['read_ahead'] else 'off'}: {r['batches_per_s']:.1f} batches/s, "
              f"replica busy {r['busy']:.2f} "
              f"(mean compute {r['mean_compute_ms']:.2f} ms)", flush=True)
        out.append(r)
    return out


def main() -> None:
    import ray

    args = parse_args()
    ray.init(num_cpus=4, include_dashboard=False, log_to_driver=False)
    try:
        asyncio.run(main_async(args))
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
