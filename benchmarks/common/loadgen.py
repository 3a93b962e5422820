"""A closed-loop load generator for anything with an async `submit(payload)`.

Closed loop: C clients, each awaiting its request and sending the next at
once, so the offered load is whatever the system sustains at concurrency C
(the queue never grows past C). Only requests that *complete* inside the
measured window count: the warm-up before it and the drain after it are
thrown away, so worker start-up, the first batches and the tail of stopping
clients never enter throughput or percentiles.

Batch sizes come from the system's own `stats()` (cumulative `batches` and
`items`), read at both edges of the window, so the mean is the window's own.
CPU is read the same way: `time.process_time()` for this process (clients,
event loop, and any host threads living here) and /proc for its child
processes (model workers), because on a shared 2-core machine a result is
only meaningful next to what it cost.

Bounded: a run stops at `duration_s` or `max_requests` completions, whichever
comes first, and clients still waiting `drain_timeout_s` after the end are
cancelled.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

Submit = Callable[[Any], Awaitable[Any]]
StatsFn = Callable[[], Mapping[str, Any]]

_CLK_TCK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


@dataclass(frozen=True, slots=True)
class LoadResult:
    """What one closed-loop run measured (times in the measured window only)."""

    concurrency: int
    window_s: float
    requests: int
    errors: int
    throughput_rps: float
    p50_ms: float
    p99_ms: float
    mean_ms: float
    max_ms: float
    batches: int | None
    mean_batch_size: float | None
    client_cpu_s: float
    client_cpu_us_per_req: float
    workers_cpu_s: float
    first_error: str | None = None

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


def processes() -> dict[int, tuple[int, float]]:
    """pid -> (parent pid, user+system CPU seconds) of every live process (Linux /proc)."""
    out: dict[int, tuple[int, float]] = {}
    try:
        entries = os.listdir("/proc")
    except OSError:
        return out
    for entry in entries:
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat", "rb") as f:
                stat = f.read().decode()
        except OSError:
            continue
        # The command name may hold spaces; fields after the last ')' are fixed.
        fields = stat[stat.rfind(")") + 2 :].split()
        out[int(entry)] = (int(fields[1]), (int(fields[11]) + int(fields[12])) / _CLK_TCK)
    return out


def children_cpu_s() -> float:
    """user+system CPU seconds of this process's live child processes."""
    me = os.getpid()
    return sum(cpu for ppid, cpu in processes().values() if ppid == me)


def _edge(stats: StatsFn | None) -> tuple[float, float, float, tuple[int, int] | None]:
    """One edge of the measured window: wall clock, our CPU, the workers' CPU, batch counts."""
    return time.perf_counter(), time.process_time(), children_cpu_s(), _stats_pair(stats)


def _stats_pair(stats: StatsFn | None) -> tuple[int, int] | None:
    if stats is None:
        return None
    s = stats()
    if "batches" not in s or "items" not in s:
        return None
    return int(s["batches"]), int(s["items"])


class _Recorder:
    """Completion times and latencies, preallocated so recording never allocates."""

    def __init__(self, capacity: int) -> None:
        self.done_at = np.empty(capacity, dtype=np.float64)
        self.latency_s = np.empty(capacity, dtype=np.float64)
        self.n = 0
        self.errors = 0
        self.first_error: str | None = None

    @property
    def full(self) -> bool:
        return self.n >= len(self.done_at)

    def ok(self, started: float, done: float) -> None:
        if self.n < len(self.done_at):
            self.done_at[self.n] = done
            self.latency_s[self.n] = done - started
            self.n += 1

    def failed(self, error: BaseException) -> None:
        self.errors += 1
        if self.first_error is None:
            self.first_error = repr(error)


async def run_closed_loop(
    submit: Submit,
    payloads: list[Any],
    *,
    concurrency: int,
    duration_s: float,
    warmup_s: float = 1.0,
    stats: StatsFn | None = None,
    max_requests: int = 1_000_000,
    drain_timeout_s: float = 10.0,
) -> LoadResult:
    """Drive `submit` with `concurrency` closed-loop clients and measure the window.

    Client i sends `payloads[k % len(payloads)]` for its k-th request.

    >>> async def echo(x):
    ...     return x
    >>> r = asyncio.run(run_closed_loop(echo, [1], concurrency=2, duration_s=0.05, warmup_s=0))
    >>> r.requests > 0
    True
    """
    if concurrency < 1 or duration_s <= 0 or warmup_s < 0 or not payloads:
        raise ValueError(
            f"concurrency={concurrency} (>= 1), duration_s={duration_s} (> 0), "
            f"warmup_s={warmup_s} (>= 0) and a non-empty payload list are needed"
        )
    rec = _Recorder(max_requests)
    stop = asyncio.Event()
    clock = time.perf_counter

    async def client(i: int) -> None:
        k = i
        while not stop.is_set() and not rec.full:
            payload = payloads[k % len(payloads)]
            k += concurrency
            t0 = clock()
            try:
                await submit(payload)
            except asyncio.CancelledError:
                raise
            except Exception as e:  # count it and go on: one error must not stop the run
                rec.failed(e)
                continue
            rec.ok(t0, clock())

    tasks = [asyncio.create_task(client(i)) for i in range(concurrency)]
    try:
        await _sleep_or_full(warmup_s, rec, tasks)
        n0 = rec.n
        t_start, cpu0, wcpu0, s0 = _edge(stats)
        await _sleep_or_full(duration_s, rec, tasks)
        t_end, cpu1, wcpu1, s1 = _edge(stats)
        stop.set()
        await asyncio.wait(tasks, timeout=drain_timeout_s)
    finally:
        stop.set()
        for t in tasks:
            t.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    done_at, lat = rec.done_at[n0 : rec.n], rec.latency_s[n0 : rec.n]
    lat_ms = lat[(done_at >= t_start) & (done_at <= t_end)] * 1e3
    window = t_end - t_start
    batches = mean_batch = None
    if s0 is not None and s1 is not None:
        batches = s1[0] - s0[0]
        mean_batch = (s1[1] - s0[1]) / batches if batches else 0.0
    n = len(lat_ms)
    pct = np.percentile(lat_ms, [50, 99]) if n else [float("nan")] * 2
    return LoadResult(
        concurrency=concurrency,
        window_s=window,
        requests=n,
        errors=rec.errors,
        throughput_rps=n / window,
        p50_ms=float(pct[0]),
        p99_ms=float(pct[1]),
        mean_ms=float(lat_ms.mean()) if n else float("nan"),
        max_ms=float(lat_ms.max()) if n else float("nan"),
        batches=batches,
        mean_batch_size=mean_batch,
        client_cpu_s=cpu1 - cpu0,
        client_cpu_us_per_req=(cpu1 - cpu0) / n * 1e6 if n else float("nan"),
        workers_cpu_s=wcpu1 - wcpu0,
        first_error=rec.first_error,
    )


async def _sleep_or_full(seconds: float, rec: _Recorder, tasks: list[asyncio.Task]) -> None:
    """Sleep `seconds`, waking early when the recorder is full or every client has died."""
    deadline = time.perf_counter() + seconds
    while (left := deadline - time.perf_counter()) > 0:
        if rec.full or all(t.done() for t in tasks):
            for t in tasks:
                if t.done() and not t.cancelled() and t.exception() is not None:
                    raise t.exception()
            return
        await asyncio.sleep(min(left, 0.05))
