"""CPU of Raybatch's own Python per `RaybatchClient` request, in one process, without Ray.

    python -m benchmarks.serve.bundle_path [--requests N] [--concurrency C] [--repeats R]
        [--model sleep|mlp] [--unstacked] [--profile OUT.prof]

What a `RaybatchClient` request costs on both sides of its one Ray call, measured where
other processes do not change it (process CPU time / requests): C callers of
`ModelRoute.infer` (validation, the `Coalescer`, one bundle a tick), each bundle pickled
and unpickled as Ray's serializer would (pickle protocol 5) and handed to the engine's
`infer` (`LocalEngine`, the code a batching actor runs per entry: submit, batch, settle,
answer), whose one model replica is an in-process echo; the answer is pickled back.
Left out: Ray's own per-call cost (~0.1-0.2 ms a bundle on each side), the model.
At C=128 with batches of 64, the two halves (answer in the engine's process, then the
callers, then the next bundle in the engine) are on the critical path one after the other
(`benchmarks.serve.client_roundtrip`), so this figure times 64 is what must fit in one batch.
`--unstacked` sends bundles as lists of tuples (as before `deployments.wire.bundles`).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import pickle
from typing import Any
from unittest import mock

import numpy as np

from benchmarks.http.front_path import Echo, best_of, window_arguments
from benchmarks.serve.models import bench_models, raybatch_config


class _Call:
    """What `actor.infer.remote(bundle, caller)` returns: awaitable once, like an ObjectRef."""

    def __init__(self, engine: Any, bundle: Any) -> None:
        self.task = asyncio.ensure_future(self._run(engine, pickle.dumps(bundle, 5)))

    @staticmethod
    async def _run(engine: Any, wire: bytes) -> Any:
        answer = await engine.infer(pickle.loads(wire))
        return pickle.loads(pickle.dumps(answer, 5))

    def __await__(self):
        return self.task.__await__()


class _Method:
    def __init__(self, engine: Any) -> None:
        self.engine = engine

    def remote(self, bundle: Any, caller: Any = None, sent: Any = None) -> _Call:
        return _Call(self.engine, bundle)


class _Actor:
    def __init__(self, engine: Any) -> None:
        self.infer = _Method(engine)


def build(model: str) -> Any:
    from cluster.config import load_config
    from deployments.batcher.hosts import make_host
    from deployments.ingress.placement import LocalEngine
    from deployments.ingress.route import ModelRoute

    config = load_config(raybatch_config(bench_models()[model], "bench", "/", "actor+idle"))
    [mc] = config.models
    engine = LocalEngine(mc)
    engine.host = make_host(mc, on_replica_died=lambda c: None)
    engine.host.add_replica(Echo())
    engine._started = asyncio.get_running_loop().create_future()
    engine._started.set_result(None)
    return ModelRoute(mc, [lambda: _Actor(engine)])


async def drive(route: Any, x: np.ndarray, total: int, c: int) -> int:
    """`total` requests from `c` callers, each sending its own input (`x + i`) and
    checking that the echo it gets back is that input; how many were not."""
    left, failed = [total], [0]

    async def caller(mine: np.ndarray) -> None:
        while left[0] > 0:
            left[0] -= 1
            out = await route.infer({"INPUT0": mine})
            if not np.array_equal(out["OUTPUT0"], mine):
                failed[0] += 1

    await asyncio.gather(*(caller(x + i) for i in range(c)))
    return failed[0]


async def main_async(args: argparse.Namespace) -> float:
    """The best of `repeats` windows, in us of CPU per request."""
    with (mock.patch("deployments.ingress.coalesce.pack", lambda bundle: bundle) if args.unstacked
          else contextlib.nullcontext()):
        return await _measure(args)


async def _measure(args: argparse.Namespace) -> float:
    route = build(args.model)
    x = bench_models()[args.model].payloads(1)[0]
    await drive(route, x, min(2000, args.requests), args.concurrency)  # warm up
    form = "unstacked" if args.unstacked else "stacked"
    return await best_of(lambda: drive(route, x, args.requests, args.concurrency),
                         args.repeats, args.requests, f"C={args.concurrency}, {form}",
                         args.profile)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    ap = window_arguments(__doc__, "sleep")
    ap.add_argument("--unstacked", action="store_true")
    return ap.parse_args(argv)


def main() -> None:
    asyncio.run(main_async(parse_args()))


if __name__ == "__main__":
    main()
