"""What one Ray actor call costs in CPU, caller and callee, on this machine: the floor
under every hop of the batching-actor path (ingress → batching actor → model replica).

    flock /tmp/raybatch-ray.lock python -m benchmarks.serve.ray_call [--calls 2000]

One async actor; calls one after another from an async caller (what an ingress replica
and a batching actor are), each awaited before the next. Payloads: nothing, a bundle of
one block as the native front sends it (one entry holding a 64 x 256 FP32 array, 64 KB,
and its request count), and the same block as raw bytes with its dtype and shape (what
msgpack carries without pickling). CPU is each process's (every thread) over the calls.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import ray


@ray.remote
class Echo:
    async def echo(self, payload: Any, caller: str | None = None, sent: Any = None) -> Any:
        return payload

    async def cpu_s(self) -> float:
        return time.process_time()


def payloads() -> dict[str, Callable[[], Any]]:
    block = np.random.default_rng(0).random((64, 256), dtype=np.float32)
    return {
        "nothing": lambda: None,
        "one block (64 x 256 FP32, as ndarray)": lambda: [(1, block, None, None, None, 64)],
        "one block as raw bytes": lambda: (1, block.tobytes(), "<f4", (64, 256), 64),
    }


async def measure(actor: Any, make: Callable[[], Any], calls: int) -> tuple[float, ...]:
    start_s, cpu_s = time.perf_counter(), time.process_time()
    callee_s = await actor.cpu_s.remote()
    for _ in range(calls):
        await actor.echo.remote(make(), "caller", (time.time(), "node"))
    callee = (await actor.cpu_s.remote()) - callee_s
    return ((time.perf_counter() - start_s) / calls * 1e6,
            (time.process_time() - cpu_s) / calls * 1e6, callee / calls * 1e6)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=2000)
    parser.add_argument("--passes", type=int, default=2)
    args = parser.parse_args()
    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False)
    try:
        actor = Echo.remote()
        ray.get(actor.cpu_s.remote())
        print(f"{'payload':40s} {'wall µs':>8s} {'caller CPU µs':>14s} {'actor CPU µs':>13s}")
        for pass_ in range(args.passes):
            for name, make in payloads().items():
                wall, caller, callee = asyncio.run(measure(actor, make, args.calls))
                print(f"{name:40s} {wall:8.0f} {caller:14.0f} {callee:13.0f}  (pass {pass_ + 1})")
        load = ", ".join(f"{x:.2f}" for x in os.getloadavg())
        print(f"{args.calls} calls each, one at a time; load average {load} on "
              f"{os.cpu_count()} CPUs")
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
