"""Sweeps of the embedded `BatchedService`: what each policy does as load grows.

For each named policy, one fresh service (its own worker), then one run per
load level, lowest first: closed loop (`benchmarks.common.loadgen`: C clients, each
sending when its last request ended) or open loop (Poisson arrivals at a rate,
whatever the service does, as independent users send). Besides throughput and
latency, each point keeps what the batcher did in its measured window alone:
the batch-size histogram and the flush reasons, the difference of the service's
cumulative `stats()` read at the window's two edges. The notebooks plot these.

    points = asyncio.run(sweep_embedded(Sleep, {"delay 2 ms": policy}, [1, 16, 64],
                                        sleep_payloads(), duration_s=1.0))
"""

from __future__ import annotations

import asyncio
import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

import numpy as np

from batching import BatchedService, DynamicPolicy
from benchmarks.common.loadgen import run_closed_loop

Kind = Literal["closed", "poisson"]


@dataclass(frozen=True)
class RealPoint:
    """One run of one policy at one load (the measured window only).

    `load` is the concurrency of a closed loop, or the rate (requests/s) of Poisson arrivals.
    """

    name: str
    kind: Kind
    load: float
    throughput_rps: float
    p50_ms: float
    p99_ms: float
    requests: int
    errors: int
    batch_sizes: dict[int, int]  # batch size -> batches
    flush_reasons: dict[str, int]  # reason -> batches

    @property
    def batches(self) -> int:
        return sum(self.batch_sizes.values())

    @property
    def mean_batch_size(self) -> float:
        return sum(k * n for k, n in self.batch_sizes.items()) / max(self.batches, 1)


def window_counts(before: Mapping[str, Any], after: Mapping[str, Any],
                  key: str) -> dict[Any, int]:
    """`after[key]` minus `before[key]` (counters of `BatchStats.as_dict`), zeros dropped.

    >>> window_counts({"by_size": {1: 3}}, {"by_size": {1: 5, 4: 2}}, "by_size")
    {1: 2, 4: 2}
    """
    old, new = before.get(key, {}), after.get(key, {})
    diff = {k: n - old.get(k, 0) for k, n in new.items()}
    if any(n < 0 for n in diff.values()) or set(old) - set(new):
        raise ValueError(f"{key} went down between the two readings: not the same service?")
    return {k: n for k, n in sorted(diff.items()) if n}


def _point(name: str, kind: Kind, load: float, latency: tuple[float, float, int],
           throughput_rps: float, errors: int, before: Mapping, after: Mapping) -> RealPoint:
    p50_ms, p99_ms, requests = latency
    return RealPoint(name, kind, load, throughput_rps, p50_ms, p99_ms, requests, errors,
                     window_counts(before, after, "by_size"),
                     window_counts(before, after, "by_reason"))


async def closed_loop_point(svc: BatchedService, name: str, payloads: Sequence[Any], *,
                            concurrency: int, duration_s: float, warmup_s: float) -> RealPoint:
    """`concurrency` closed-loop clients against a started service."""
    readings: list[dict[str, Any]] = []

    def stats() -> dict[str, Any]:  # the load generator reads it at the window's edges
        readings.append(svc.stats())
        return readings[-1]

    r = await run_closed_loop(svc.submit, list(payloads), concurrency=concurrency,
                              duration_s=duration_s, warmup_s=warmup_s, stats=stats)
    return _point(name, "closed", concurrency, (r.p50_ms, r.p99_ms, r.requests),
                  r.throughput_rps, r.errors, readings[0], readings[-1])


async def poisson_point(svc: BatchedService, name: str, payloads: Sequence[Any], *,
                        rate_per_s: float, duration_s: float, warmup_s: float,
                        seed: int = 0) -> RealPoint:
    """Requests at Poisson times (`rate_per_s` on average) against a started service.

    Latency counts the requests sent in the window [warmup_s, warmup_s + duration_s],
    however late they end; throughput the requests that ended in it.
    """
    rng = np.random.default_rng(seed)
    clock = time.perf_counter
    start = clock()
    w0, w1 = start + warmup_s, start + warmup_s + duration_s
    latencies: list[float] = []
    ends: list[float] = []
    errors = 0

    async def one(payload: Any) -> None:
        nonlocal errors
        sent = clock()
        try:
            await svc.submit(payload)
        except Exception:  # count it and go on: one error must not stop the run
            errors += 1
            return
        ends.append(done := clock())
        if w0 <= sent < w1:
            latencies.append(done - sent)

    tasks, readings, t, i = [], [], start, 0
    while (t := t + rng.exponential(1.0 / rate_per_s)) < w1:
        if not readings and t >= w0:
            readings.append(svc.stats())
        await asyncio.sleep(max(0.0, t - clock()))
        tasks.append(asyncio.ensure_future(one(payloads[i % len(payloads)])))
        i += 1
    await asyncio.sleep(max(0.0, w1 - clock()))
    readings.append(svc.stats())
    await asyncio.gather(*tasks)
    ms = np.asarray(latencies) * 1e3
    p50, p99 = (float(v) for v in np.percentile(ms, [50, 99])) if len(ms) else (np.nan,) * 2
    completed = sum(w0 <= e < w1 for e in ends)
    return _point(name, "poisson", rate_per_s, (p50, p99, len(ms)), completed / duration_s,
                  errors, readings[0], readings[-1])


async def sweep_embedded(
    model: Any,
    policies: Mapping[str, DynamicPolicy],
    loads: Sequence[float],
    payloads: Sequence[Any],
    *,
    kind: Kind = "closed",
    duration_s: float,
    warmup_s: float = 0.3,
    init_args: Sequence[Any] = (),
    max_inflight_batches: int = 2,
    executor: str = "process",
    repeats: int = 1,
) -> list[RealPoint]:
    """Every policy at every load (concurrencies for `closed`, rates for `poisson`);
    points in policy order, then load order.

    Each point is the best of `repeats` runs: the one with the lowest p99. On a shared
    machine a neighbour can stall a run for a few hundred milliseconds; it can only
    make a run slower, never faster, so the least disturbed run is the best estimate.
    """
    if kind not in ("closed", "poisson"):
        raise ValueError(f"kind={kind!r} must be 'closed' or 'poisson'")
    if repeats < 1:
        raise ValueError(f"repeats={repeats} must be >= 1")
    points = []
    for name, policy in policies.items():
        async with BatchedService(model, policy=policy, init_args=init_args,
                                  max_inflight_batches=max_inflight_batches,
                                  executor=executor) as svc:
            for load in loads:
                runs = []
                for _ in range(repeats):
                    if kind == "closed":
                        runs.append(await closed_loop_point(
                            svc, name, payloads, concurrency=int(load), duration_s=duration_s,
                            warmup_s=warmup_s))
                    else:
                        runs.append(await poisson_point(
                            svc, name, payloads, rate_per_s=load, duration_s=duration_s,
                            warmup_s=warmup_s))
                points.append(best_run(runs))
    return points


def best_run(runs: Sequence[RealPoint]) -> RealPoint:
    """The run with the lowest p99 (a run without latencies counts as the worst)."""
    return min(runs, key=lambda p: (math.isnan(p.p99_ms), p.p99_ms))


def by_name(points: Sequence[RealPoint], name: str) -> list[RealPoint]:
    """The points of policy `name`, by load."""
    out = sorted((p for p in points if p.name == name), key=lambda p: p.load)
    if not out:
        raise KeyError(f"no points of a policy named {name!r}; there are "
                       f"{sorted({p.name for p in points})}")
    return out
