"""A discrete-event simulator: the real batching engine on a virtual clock.

It predicts throughput and latency of a policy before deploying it, by driving
the objects production runs (`DynamicBatcher`, `Ledger`) with an arrival process
(`batching.simulate.arrivals`) and replicas whose batches take `a + b·cost` seconds.
Modelling choices, each what a host does or the simplest honest stand-in:
- one decision per instant: every event at the same virtual time (a burst, a
  completion and the closed-loop requests it triggers) is applied before the
  batcher is asked, as the ingress bundles whatever is waiting into one call;
- the host loop is the production one: `next_batch(now, free_slots, idle)` until it
  says None, then wait for `deadline()`, an arrival or a completion;
- a replica computes its batches one after another; `max_inflight` > 1 queues
  the next batch at the replica while one runs (pipelining), which hides
  `hop_s`, the one-way call latency between host and replica. The engine's
  latency model is fed the compute time alone, not the wait at the replica;
- `timer_tick_s` models the host's timer resolution: asyncio's epoll rounds a
  timeout up to the next millisecond, so a 2 ms delay fires 2 to 3 ms later;
- window [warmup_s, end]: throughput counts requests that ended in it, latency
  and failures the requests that arrived in it, however late they ended. Every
  arrived request runs to its end; one the batcher leaves open is `unfinished`.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from batching.dynamic.batcher import DynamicBatcher
from batching.dynamic.policy import DynamicPolicy
from batching.errors import RaybatchError
from batching.ledger import Ledger, Outcome
from batching.simulate.arrivals import Arrivals, Bursts, ClosedLoop, Poisson, Trace
from batching.simulate.report import SimReport, latency_summary_ms
from batching.types import Batch, Request

__all__ = ["Arrivals", "Bursts", "ClosedLoop", "Poisson", "SimReport", "Trace", "simulate"]

_ARRIVAL, _DONE, _TIMER = 0, 1, 2
_EPS_S = 1e-9  # times this close count as equal: virtual times are sums of float durations
# What one run may hold: each event (an arrival, a batch's end, a timer) leaves a record or
# two behind, so a run's memory and time follow its events; past this bound it stops with
# an error saying what to ask for instead (`simulate(max_events=...)` moves it). Replicas
# are each a record from the start.
MAX_EVENTS = 1_000_000
MAX_REPLICAS = 100_000


@dataclass(frozen=True)
class _Config:
    arrivals: Arrivals
    replicas: int
    latency_a_s: float
    latency_b_s: float
    max_inflight: int
    hop_s: float
    timer_tick_s: float
    jitter: float
    items_per_request: int
    make_items: Callable[[np.random.Generator], Sequence[Any]] | None
    timeout_s: float | None
    duration_s: float | None
    num_requests: int | None
    warmup_s: float
    max_events: int


@dataclass(slots=True)
class _Replica:
    outstanding: int = 0  # batches sent to it whose results the host has not seen yet
    free_at_s: float = 0.0  # when it finishes computing the last batch queued at it


class _Sim:
    """One run: the event heap, the engine objects, and what was measured."""

    def __init__(self, cfg: _Config, policy: DynamicPolicy, seed: int) -> None:
        self.cfg = cfg
        self.batcher = DynamicBatcher(policy)
        self.batcher.replicas = cfg.replicas  # admission's wait is shared among them
        self.ledger = Ledger(preserve_ordering=policy.preserve_ordering)
        # Separate streams, so that jitter or item sizes do not move the arrivals.
        arrival_rng, self.latency_rng, self.items_rng = (
            np.random.default_rng(s) for s in np.random.SeedSequence(seed).spawn(3)
        )
        self.source = cfg.arrivals.times(arrival_rng)
        self.replicas = [_Replica() for _ in range(cfg.replicas)]
        self.heap: list[tuple[float, int, int, object]] = []
        self.seq, self.ids = itertools.count(), itertools.count()
        self.events = 0
        self.timer_s: float | None = None  # when the batcher wants to be woken
        self.timer_id = 0  # the one timer event that counts (later ones replace it)
        self.sent = self.measured = 0
        self.open: dict[int, tuple[float, int]] = {}  # request id -> (arrival_s, num_items)
        self.ends: list[tuple[float, int]] = []  # (end_s, num_items) of each completed request
        self.latencies_s: list[float] = []
        self.failed: Counter = Counter()
        self.busy: list[tuple[float, float]] = []  # compute intervals of all batches
        self.sizes: Counter = Counter()
        self.reasons: Counter = Counter()

    def run(self) -> SimReport:
        self._pull_arrival()
        while self.heap:
            now, acted = self.heap[0][0], False
            while self.heap and self.heap[0][0] == now:  # every event of this instant first
                _, _, kind, payload = heapq.heappop(self.heap)
                acted |= self._handle(kind, payload, now)
            if acted:
                self._step(now)
        return self._report()

    def _push(self, t: float, kind: int, payload: object) -> None:
        self.events += 1
        if self.events > self.cfg.max_events:
            raise ValueError(
                f"the run passed {self.cfg.max_events:,} events (arrivals, batches, timers) "
                f"at {t:.3f} s of virtual time, {self.sent:,} requests sent: ask for fewer "
                "requests (a shorter duration, a lower rate or concurrency, num_requests) or "
                "fewer items per request, or raise max_events (each event keeps a record)")
        heapq.heappush(self.heap, (t, next(self.seq), kind, payload))

    def _schedule_arrival(self, t: float | None, from_source: bool) -> None:
        cfg = self.cfg
        if t is None or (cfg.duration_s is not None and t >= cfg.duration_s - _EPS_S):
            return
        if cfg.num_requests is not None and self.sent >= cfg.num_requests:
            return
        self.sent += 1
        self._push(t, _ARRIVAL, from_source)

    def _pull_arrival(self) -> None:
        # One pending arrival from the source at a time, so an endless process costs nothing.
        self._schedule_arrival(next(self.source, None), from_source=True)

    def _handle(self, kind: int, payload, now: float) -> bool:
        """Apply one event; False for a timer the batcher has since moved."""
        if kind == _ARRIVAL:
            if payload:
                self._pull_arrival()
            self._arrive(now)
        elif kind == _DONE:
            self._done(*payload, now)
        elif payload != self.timer_id:
            return False
        else:
            self.timer_s = None
        return True

    def _arrive(self, now: float) -> None:
        cfg, rid = self.cfg, next(self.ids)
        items = cfg.make_items(self.items_rng) if cfg.make_items else range(cfg.items_per_request)
        request = Request(rid, items, timeout_s=cfg.timeout_s)
        self.open[rid] = (now, request.num_items)
        self.measured += self._measured(now)
        self.ledger.open(request)
        try:
            self.batcher.submit(request, now)
        except RaybatchError as e:  # QueueFull, InvalidRequest: the client learns at once
            self._record(self.ledger.fail(rid, e), now)

    def _step(self, now: float) -> None:
        """The host's loop: send every batch due, end what expired, set the timer."""
        q = self.batcher
        while (batch := q.next_batch(now, self._free_slots(), self._idle_replicas())) is not None:
            self._dispatch(batch, now)
        for failure in q.take_failures():
            self._record(self.ledger.fail(failure.request_id, failure.error), now)
        t = q.deadline()
        tick = self.cfg.timer_tick_s
        if t is None or (t == self.timer_s and not tick):
            return
        if t <= now:
            raise RuntimeError(
                f"the batcher asked to be woken at {t!r}, not after now={now!r}, although "
                "next_batch sent nothing: a batcher bug; the simulation cannot go on"
            )
        # Like asyncio's epoll loop, every wake-up re-arms the timer with the time left
        # rounded up to a whole tick, so a timer that outlives other events fires late.
        self.timer_s = t
        self.timer_id += 1
        fires = now + math.ceil((t - now) / tick - _EPS_S) * tick if tick else t
        self._push(fires, _TIMER, self.timer_id)

    def _free_slots(self) -> int:
        return sum(self.cfg.max_inflight - r.outstanding for r in self.replicas)

    def _idle_replicas(self) -> int:
        return sum(r.outstanding == 0 for r in self.replicas)

    def _dispatch(self, batch: Batch, now: float) -> None:
        cfg = self.cfg
        replica = min(self.replicas, key=lambda r: (r.outstanding, r.free_at_s))  # least work
        start = max(now + cfg.hop_s, replica.free_at_s)
        compute_s = cfg.latency_a_s + cfg.latency_b_s * batch.cost
        if cfg.jitter:  # a log-normal factor with mean 1
            z = self.latency_rng.standard_normal()
            compute_s *= math.exp(cfg.jitter * z - cfg.jitter**2 / 2)
        replica.free_at_s = start + compute_s
        replica.outstanding += 1
        self.busy.append((start, start + compute_s))
        if self._measured(batch.created_s):
            self.sizes[batch.num_items] += 1
            self.reasons[batch.reason.value] += 1
        self._push(start + compute_s + cfg.hop_s, _DONE, (batch.id, replica, compute_s))

    def _done(self, batch_id: int, replica: _Replica, compute_s: float, now: float) -> None:
        replica.outstanding -= 1
        batch = self.batcher.complete(batch_id, now, compute_s=compute_s)
        self._record(self.ledger.deliver(batch, np.zeros(batch.num_items)), now)

    def _record(self, outcomes: list[Outcome], now: float) -> None:
        for outcome in outcomes:
            arrival_s, n = self.open.pop(outcome.request_id)
            measured = self._measured(arrival_s)
            if outcome.error is None:
                self.ends.append((now, n))
                if measured:
                    self.latencies_s.append(now - arrival_s)
            elif measured:
                self.failed[type(outcome.error).__name__] += 1
            self._schedule_arrival(self.cfg.arrivals.after_end(now), from_source=False)

    def _measured(self, t: float) -> bool:
        """Whether an arrival or a batch at `t` is in the window (which opens at warmup_s)."""
        return t >= self.cfg.warmup_s - _EPS_S

    def _report(self) -> SimReport:
        w0, w1 = self.cfg.warmup_s, self.cfg.duration_s
        if w1 is None:
            w1 = max((end for end, _ in self.ends), default=w0)
        window_s = max(w1 - w0, 0.0)
        rate = 1.0 / window_s if window_s else 0.0
        done = [n for end, n in self.ends if w0 + _EPS_S < end <= w1 + _EPS_S]
        busy_s = sum(max(0.0, min(end, w1) - max(start, w0)) for start, end in self.busy)
        completed, failed = len(self.latencies_s), dict(sorted(self.failed.items()))
        batches = sum(self.sizes.values())
        return SimReport(
            window_s=window_s,
            arrived=self.measured,
            completed=completed,
            failed=failed,
            unfinished=self.measured - completed - sum(failed.values()),
            throughput_rps=len(done) * rate,
            throughput_items_per_s=sum(done) * rate,
            latency_ms=latency_summary_ms(self.latencies_s),
            batches=batches,
            mean_batch_size=sum(k * n for k, n in self.sizes.items()) / max(batches, 1),
            batch_sizes=dict(sorted(self.sizes.items())),
            flush_reasons=dict(sorted(self.reasons.items())),
            utilization=busy_s * rate / self.cfg.replicas,
        )


def simulate(
    policy: DynamicPolicy,
    arrivals: Arrivals,
    *,
    replicas: int = 1,
    latency_a_s: float,
    latency_b_s: float,
    max_inflight: int = 1,
    hop_s: float = 0.0,
    timer_tick_s: float = 0.0,
    jitter: float = 0.0,
    items_per_request: int = 1,
    make_items: Callable[[np.random.Generator], Sequence[Any]] | None = None,
    timeout_s: float | None = None,
    duration_s: float | None = None,
    num_requests: int | None = None,
    warmup_s: float = 0.0,
    seed: int = 0,
    max_events: int = MAX_EVENTS,
) -> SimReport:
    """Run `policy` against `arrivals` on `replicas` whose batches take `a + b·cost` seconds.

    Arrivals stop at `duration_s` or after `num_requests`, whichever comes first
    (a `Trace` also stops by itself). A request carries `items_per_request`
    items, or what `make_items(rng)` returns (for a policy's `cost_fn` to price).
    `jitter` is the sigma of a log-normal factor, mean 1, on each compute time.
    A run of more than `max_events` events is stopped with a ValueError.

    >>> r = simulate(DynamicPolicy(max_batch_size=1), ClosedLoop(1), latency_a_s=0.002,
    ...              latency_b_s=0.0, duration_s=1.0)
    >>> round(r.latency_ms["p50"], 3), r.completed
    (2.0, 500)
    """
    cfg = _Config(
        arrivals, replicas, latency_a_s, latency_b_s, max_inflight, hop_s, timer_tick_s, jitter,
        items_per_request, make_items, timeout_s, duration_s, num_requests, warmup_s,
        max_events,
    )
    _validate(cfg)
    return _Sim(cfg, policy, seed).run()


def _validate(cfg: _Config) -> None:
    _check(1 <= cfg.replicas <= MAX_REPLICAS,
           f"replicas={cfg.replicas} must be 1..{MAX_REPLICAS:,} (each is a record in the run)")
    _check(cfg.max_inflight >= 1, f"max_inflight={cfg.max_inflight} must be >= 1")
    for name in ("latency_a_s", "latency_b_s", "hop_s", "timer_tick_s", "jitter", "warmup_s",
                 "timeout_s", "duration_s"):
        value = getattr(cfg, name)
        _check(value is None or math.isfinite(value), f"{name}={value} must be a finite number")
        _check(value is None or name in ("timeout_s", "duration_s") or value >= 0,
               f"{name}={value} must be >= 0")  # those two have checks of their own below
    _check(
        cfg.latency_a_s + cfg.latency_b_s > 0,
        "latency_a_s and latency_b_s are both 0: a batch must take some time, or a closed "
        "loop spins at one instant forever",
    )
    _check(cfg.items_per_request >= 1, f"items_per_request={cfg.items_per_request} must be >= 1")
    _check(cfg.max_events >= 1, f"max_events={cfg.max_events} must be >= 1")
    _check(cfg.timeout_s is None or cfg.timeout_s > 0, f"timeout_s={cfg.timeout_s} must be > 0")
    _check(
        cfg.num_requests is None or cfg.num_requests >= 1,
        f"num_requests={cfg.num_requests} must be >= 1",
    )
    if cfg.duration_s is not None:
        _check(
            cfg.duration_s > cfg.warmup_s,
            f"duration_s={cfg.duration_s} must exceed warmup_s={cfg.warmup_s}",
        )
    elif cfg.num_requests is None and not cfg.arrivals.finite:
        kind = type(cfg.arrivals).__name__
        raise ValueError(f"{kind} arrivals never end: give duration_s or num_requests")


def _check(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)
