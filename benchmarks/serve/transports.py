"""One engine-to-replica hop three ways: a Ray actor call, Raybatch's direct connection
(`deployments.wire.link`), and a Ray compiled graph (shared-memory channels between the
processes of one node). What it answers: before the project grows its own transport,
what does Ray already offer on the same hop, in time and in CPU?

    flock /tmp/raybatch-ray.lock python -m benchmarks.serve.transports [--calls 2000]

A sync replica-like actor echoes a batch (an array of 1 or 64 rows of 256 FP32, as the
mlp's batches) back to an async caller (what a batching actor is), one call after
another, each awaited before the next: the lone request's hop and a full batch's. For
each: the round trip's median and p90, and the CPU of the caller's and the actor's
processes (every thread) per call. The compiled graph is driven with `enable_asyncio`
(`execute_async`), as an async batching actor would drive it.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import ray


@ray.remote
class Replica:
    """Echoes a batch, as a model replica answers one (`ModelReplica.run`'s shape)."""

    def __init__(self) -> None:
        self.link: Any = None

    def run(self, items: Any) -> tuple[Any, float]:
        return items, 0.0

    def cpu_s(self) -> float:
        return _process_cpu_s()

    def link_address(self) -> tuple[str, int, bytes]:
        from deployments.replica.link_server import ThreadedLinkServer

        if self.link is None:
            self.link = ThreadedLinkServer(self.run, 1)
        return self.link.address("127.0.0.1")


def _process_cpu_s() -> float:
    t = os.times()
    return t.user + t.system


async def timed(call: Callable[[Any], Awaitable[Any]], x: np.ndarray, calls: int,
                actor: Any) -> dict[str, float]:
    for _ in range(50):  # warm
        await call(x)
    lat = []
    callee0, caller0 = await actor.cpu_s.remote(), _process_cpu_s()
    for _ in range(calls):
        t = time.perf_counter()
        out = await call(x)
        lat.append(time.perf_counter() - t)
    caller, callee = _process_cpu_s() - caller0, (await actor.cpu_s.remote()) - callee0
    got = out[0] if isinstance(out, tuple) else out
    assert np.array_equal(got, x), "the hop answered wrong"
    lat.sort()
    return {"p50_us": statistics.median(lat) * 1e6, "p90_us": lat[int(len(lat) * 0.9)] * 1e6,
            "caller_cpu_us": caller / calls * 1e6, "actor_cpu_us": callee / calls * 1e6}


async def measure(calls: int) -> list[dict[str, Any]]:
    from ray.dag import InputNode

    from deployments.wire.link import Link

    rows = []
    ray_actor, link_actor, graph_actor = Replica.remote(), Replica.remote(), Replica.remote()
    link = await Link.open_to(*await link_actor.link_address.remote())
    with InputNode() as inp:
        dag = graph_actor.run.bind(inp)
    graph = dag.experimental_compile(enable_asyncio=True)

    async def by_graph(x: Any) -> Any:
        return await (await graph.execute_async(x))

    ways: dict[str, tuple[Callable[[Any], Awaitable[Any]], Any]] = {
        "Ray actor call": (lambda x: ray_actor.run.remote(x), ray_actor),
        "direct connection (deployments.wire.link)": (lambda x: link.call(x), link_actor),
        "Ray compiled graph (shared memory, execute_async)": (by_graph, graph_actor),
    }
    try:
        for rows_n in (1, 64):
            x = np.random.default_rng(0).random((rows_n, 256), dtype=np.float32)
            for name, (call, actor) in ways.items():
                r = await timed(call, x, calls, actor)
                rows.append({"transport": name, "batch_rows": rows_n, **r})
                print(f"{name:<52} {rows_n:>3} rows  p50 {r['p50_us']:7.1f} us  p90 "
                      f"{r['p90_us']:7.1f} us  CPU caller {r['caller_cpu_us']:6.1f} + actor "
                      f"{r['actor_cpu_us']:6.1f} us/call", flush=True)
    finally:
        graph.teardown()
        link.close()
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    args = parser.parse_args()
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": os.getcwd()}})
    try:
        asyncio.run(measure(args.calls))
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
