"""Every `raybatch_*` series, declared in one table, and the recorders that feed them.

`SERIES` is the one place a metric is named: name, kind, help, unit, labels and
buckets. Prometheus conventions: base units (seconds), counters end in `_total`,
histogram buckets from 100 us to 30 s (batching waits) or powers of two (sizes).
Labels are `model`, `version` and only bounded ones (`priority`, `reason`,
`outcome`, `replica`, `resource`, and the ingress's `route`/`status`); never a
request or sequence id. They are recorded with `ray.util.metrics` where they
happen: the batching actor (`BatcherMetrics`, the engine's `Recorder` plus a
sampler of the host's gauges and counts), the replicas (`ReplicaMetrics`: compute
time), and the callers (`CallerMetrics`: requests refused before a batching actor
saw them, or lost with it). Ray exports each on its node's metrics port as
`ray_<name>`, with its own `SessionName`, `NodeAddress`, `WorkerId`... labels.

Cost: no Ray call per request or per batch in the batching actor. A Ray metric call (a
`Histogram.observe`, a `Counter.inc`) costs more than the actor spends on a request in a
big batch. So the actor only counts, in plain Python (a bisect per value; its cost:
`benchmarks.serve.metrics_overhead --micro`), and every `metrics.interval_s` sends the
increments of its counters and its `sampled` histograms: bucket counts exported as the
series of a Prometheus histogram (`_bucket{le}`, `_sum`, `_count`, cumulative) through Ray
gauges, which PromQL reads like any histogram. The replicas observe their compute time per
batch into a Ray histogram. Counters of known label sets start at 0, so a rate or an alert
sees 0, not nothing. Ray is imported on first use: the table loads without it.
"""

from __future__ import annotations

import asyncio
import logging
from bisect import bisect_left
from collections.abc import Awaitable, Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from batching.metrics import OUTCOMES, STEP, BatchDone, BatchSent, HostSnapshot, StepDone
from batching.stats import LATENCY_BUCKETS_S
from batching.types import FlushReason
from cluster.config import ModelConfig

log = logging.getLogger(__name__)

MODEL = ("model", "version")
SIZE_BUCKETS = tuple(float(2**i) for i in range(13))  # 1 .. 4096 items
COST_BUCKETS = tuple(float(2**i) for i in range(17))  # 1 .. 65536 (tokens, rows...)
PREFIX = "ray_"  # what Ray puts before every application metric it exports


@dataclass(frozen=True, slots=True)
class PoolSnapshot:
    """A replica pool's counts at one instant (`ReplicaPool.snapshot`)."""

    desired: int  # what the scaling rule wants now
    running: int  # serving batches
    pending: int  # created, not serving yet (unplaced, or starting)
    demand: dict[str, float]  # the resources one replica asks for


@dataclass(frozen=True, slots=True)
class Series:
    name: str
    kind: str  # "counter" | "gauge" | "histogram"
    help: str
    unit: str
    labels: tuple[str, ...]
    buckets: tuple[float, ...] = ()
    recorded_in: str = "batcher"  # "batcher" | "replica" | "caller" | "ingress"
    sampled: bool = False  # a histogram kept as bucket counts, exported through gauges

    @property
    def exported(self) -> str:
        """The name Prometheus sees."""
        return PREFIX + self.name


def _s(name: str, kind: str, help_: str, unit: str, labels: tuple[str, ...] = (),
       buckets: tuple[float, ...] = (), where: str = "batcher", sampled: bool = False
       ) -> Series:
    return Series(name, kind, help_, unit, MODEL + labels, buckets, where, sampled)


SERIES: tuple[Series, ...] = (
    _s("raybatch_requests_total", "counter", "Requests ended, by outcome (ok, invalid, "
       "queue_full, deadline, cancelled, model_error, worker_died, closed).", "requests",
       ("outcome",), where="batcher+caller"),
    _s("raybatch_queued_requests", "gauge", "Requests waiting for a batch (to join, for a "
       "generative model), per priority level.", "requests", ("priority",)),
    _s("raybatch_queued_items", "gauge", "Items of the waiting requests, per priority level.",
       "items", ("priority",)),
    _s("raybatch_queue_wait_seconds", "histogram", "From a request's arrival at its batching "
       "actor to the batch (or generation step) it starts in.", "seconds", ("priority",),
       LATENCY_BUCKETS_S, sampled=True),
    _s("raybatch_batch_size_items", "histogram", "Items per batch; sequences per generation "
       "step.", "items", (), SIZE_BUCKETS, sampled=True),
    _s("raybatch_batch_cost", "histogram", "Cost per batch under the policy's cost function "
       "(items when it has none); tokens per generation step.", "cost", (), COST_BUCKETS,
       sampled=True),
    _s("raybatch_batches_total", "counter", "Batches sent, by why they left the queue (full, "
       "preferred, delay, deadline, drain, ...; step for a generation step).", "batches",
       ("reason",)),
    _s("raybatch_batch_latency_seconds", "histogram", "From forming a batch to its answer, "
       "seen by the batching actor: transport and replica queue included.", "seconds", (),
       LATENCY_BUCKETS_S, sampled=True),
    _s("raybatch_batch_compute_seconds", "histogram", "Time a replica spent on one batch or "
       "step, pre- and post-processing included, measured in the replica.", "seconds", (),
       LATENCY_BUCKETS_S, "replica"),
    _s("raybatch_inflight_batches", "gauge", "Batches (steps) sent to a replica and not "
       "answered yet.", "batches", ("replica",)),
    _s("raybatch_replicas_desired", "gauge", "Replicas the pool's scaling rule wants.",
       "replicas"),
    _s("raybatch_replicas_running", "gauge", "Replicas serving batches.", "replicas"),
    _s("raybatch_replicas_pending", "gauge", "Replicas created but not serving yet "
       "(unplaced: waiting for resources, or starting).", "replicas"),
    _s("raybatch_replicas_pending_demand", "gauge", "Resources the pending replicas ask for.",
       "resources", ("resource",)),
    _s("raybatch_replica_deaths_total", "counter", "Replicas that died with work on them.",
       "replicas"),
    _s("raybatch_retried_batches_total", "counter", "Batches sent again after their replica "
       "died.", "batches"),
    _s("raybatch_sequences_live", "gauge", "Sequences holding state on a replica.",
       "sequences"),
    _s("raybatch_sequences_lost_total", "counter", "Sequences whose state died with their "
       "replica.", "sequences"),
    _s("raybatch_sequences_idle_expired_total", "counter", "Sequences ended after "
       "max_sequence_idle_s without a request.", "sequences"),
    _s("raybatch_generation_active_sequences", "gauge", "Generations advancing on a replica.",
       "sequences"),
    _s("raybatch_generation_tokens_total", "counter", "Tokens generated, all sequences "
       "together.", "tokens"),
    _s("raybatch_generation_ttft_seconds", "histogram", "From a generation's arrival to its "
       "first text.", "seconds", (), LATENCY_BUCKETS_S, sampled=True),
    _s("raybatch_generation_inter_token_seconds", "histogram", "Between two steps of a "
       "replica: the gap every sequence in both saw between its tokens (one observation per "
       "step).", "seconds", (), LATENCY_BUCKETS_S, sampled=True),
    _s("raybatch_generation_cancelled_total", "counter", "Generations cancelled by their "
       "caller (or because it went away).", "generations"),
    Series("raybatch_http_requests_total", "counter", "HTTP responses of the ingress, by "
           "route template and status code.", "requests", ("route", "status"),
           recorded_in="ingress"),
)
BY_NAME = {s.name: s for s in SERIES}
_REGISTRY: dict[str, Any] = {}  # name -> the ray.util.metrics object, one per process


def metric(name: str) -> Any:
    """The Ray metric object of series `name` in this process, created on first use."""
    m = _REGISTRY.get(name)
    if m is None:
        from ray.util import metrics as ray_metrics

        s = BY_NAME[name]
        if s.sampled:
            m = SampledHistogram(s, ray_metrics.Gauge)
        elif s.kind == "histogram":
            m = ray_metrics.Histogram(s.name, s.help, list(s.buckets), tag_keys=s.labels)
        else:
            cls = ray_metrics.Counter if s.kind == "counter" else ray_metrics.Gauge
            m = cls(s.name, s.help, tag_keys=s.labels)
        _REGISTRY[name] = m
    return m


class Buckets:
    """Values counted per bucket of `bounds` (the last: above them all), and their sum."""

    __slots__ = ("bounds", "counts", "sum")

    def __init__(self, bounds: tuple[float, ...]) -> None:
        self.bounds = bounds
        self.counts = [0] * (len(bounds) + 1)
        self.sum = 0.0

    def observe(self, value: float) -> None:
        self.counts[bisect_left(self.bounds, value)] += 1
        self.sum += value


class SampledHistogram:
    """A histogram kept as `Buckets` where it is recorded and exported, when sampled,
    as Prometheus's histogram series (cumulative `_bucket{le}`, `_sum`, `_count`)
    through Ray gauges: no Ray call per value."""

    def __init__(self, series: Series, gauge: Any) -> None:
        self.bounds = series.buckets
        self._le = [_le(b) for b in series.buckets] + ["+Inf"]
        self._bucket = gauge(series.name + "_bucket", series.help, tag_keys=(*series.labels,
                                                                             "le"))
        self._sum = gauge(series.name + "_sum", series.help, tag_keys=series.labels)
        self._count = gauge(series.name + "_count", series.help, tag_keys=series.labels)

    def publish(self, buckets: Buckets, tags: dict[str, str]) -> None:
        total = 0
        for le, n in zip(self._le, buckets.counts):
            total += n
            self._bucket.set(total, {**tags, "le": le})
        self._sum.set(buckets.sum, tags)
        self._count.set(total, tags)


def _le(bound: float) -> str:
    """A bucket bound as Prometheus clients write `le`: 0.001, 1.0, 30.0."""
    return repr(float(bound))


def zero(counter: Any, tags: dict[str, str]) -> None:
    """Make a counter's label set exist at 0 (Prometheus practice: a rate over it is 0,
    not "no data"). `Counter.inc` refuses 0, so this goes one step below it."""
    try:
        counter._record(0.0, tags)
    except Exception as e:  # a Ray without that internal: the series appears on first inc
        log.debug("cannot start %s at 0: %r", counter.info.get("name"), e)


def add_increments(counter: Any, now: Mapping[Any, int], last: dict[Any, int],
                   tags: Any) -> None:
    """Add to `counter` what each cumulative count in `now` grew by since `last`."""
    for key, value in now.items():
        grown = value - last.get(key, 0)
        if grown > 0:
            counter.inc(grown, tags(key))
            last[key] = value


def model_tags(config: ModelConfig) -> dict[str, str]:
    return {"model": config.name, "version": config.version}


def priority_levels(config: ModelConfig) -> int:
    return getattr(config.batching, "priority_levels", 1)


class CallerMetrics:
    """Requests a caller (the ingress, a client) ended itself: refused before any
    batching actor saw them (`invalid`), or lost with their batching actor."""

    def __init__(self, config: ModelConfig) -> None:
        self._tags = {o: {**model_tags(config), "outcome": o} for o in OUTCOMES}
        self._requests = metric("raybatch_requests_total")

    def count(self, outcome: str, n: int = 1) -> None:
        if n > 0:
            self._requests.inc(n, self._tags[outcome])


class ReplicaMetrics:
    """What a model replica records itself: the compute time of each batch."""

    def __init__(self, config: ModelConfig) -> None:
        self._tags = model_tags(config)
        self._compute = metric("raybatch_batch_compute_seconds")

    def compute(self, seconds: float) -> None:
        self._compute.observe(seconds, self._tags)


class BatcherMetrics:
    """The batching actor's: the engine's `Recorder` and the sampler of its host.

    Per batch and step it only counts, in this process (a bisect per value, no Ray
    call); `publish`, every `metrics.interval_s`, sends it all to Ray: the sampled
    histograms, the increments of every count since the last call, the gauges of the
    host's `HostSnapshot` and the pool's `PoolSnapshot`.
    """

    def __init__(self, config: ModelConfig, shard: int = 0,
                 replica_prefix: str | None = None) -> None:
        """`replica_prefix` goes before each model replica's name in the `replica` label:
        `shard<N>-` by default when the model has shards, `ingress<rank>-` for an engine
        in one of several ingress replicas (each has its own `replica-0`...)."""
        self.kind = config.batching.kind
        self._tags = tags = model_tags(config)
        if replica_prefix is None:
            replica_prefix = f"shard{shard}-" if config.batcher.shards > 1 else ""
        self._replica_prefix = replica_prefix
        levels = range(1, priority_levels(config) + 1)
        self._level_tags = {lvl: {**tags, "priority": str(lvl)} for lvl in levels}
        self._reason_tags: dict[str, dict[str, str]] = {}
        self._outcome_tags = {o: {**tags, "outcome": o} for o in OUTCOMES}
        self._last: dict[str, dict[Any, int]] = {}
        self._wait_bounds = BY_NAME["raybatch_queue_wait_seconds"].buckets
        self._waits = {lvl: Buckets(self._wait_bounds) for lvl in levels}
        self._hists = {name: Buckets(BY_NAME[name].buckets) for name in (
            "raybatch_batch_size_items", "raybatch_batch_cost", "raybatch_batch_latency_seconds",
            "raybatch_generation_ttft_seconds", "raybatch_generation_inter_token_seconds")}
        self._reasons: dict[str, int] = {}  # batches sent, by flush reason
        self._refused: dict[str, int] = {}  # requests refused at submit, by outcome
        self._start_counters()

    def _start_counters(self) -> None:
        reasons = [STEP] if self.kind == "iterative" else [r.value for r in FlushReason]
        for reason in reasons:
            zero(metric("raybatch_batches_total"), self._reason(reason))
        for tags in self._outcome_tags.values():
            zero(metric("raybatch_requests_total"), tags)
        for name in self._counter_names():
            zero(metric(name), self._tags)

    def _counter_names(self) -> list[str]:
        names = ["raybatch_replica_deaths_total"]
        names += {"dynamic": ["raybatch_retried_batches_total"],
                  "sequence": ["raybatch_sequences_lost_total",
                               "raybatch_sequences_idle_expired_total"],
                  "iterative": ["raybatch_generation_tokens_total",
                                "raybatch_generation_cancelled_total"]}[self.kind]
        return names

    def _reason(self, reason: str) -> dict[str, str]:
        tags = self._reason_tags.get(reason)
        if tags is None:
            tags = self._reason_tags[reason] = {**self._tags, "reason": reason}
        return tags

    # -- the engine's Recorder: once per batch or step, counting only ----------------------
    def batch_sent(self, batch: BatchSent) -> None:
        reasons, h = self._reasons, self._hists
        reasons[batch.reason] = reasons.get(batch.reason, 0) + 1
        h["raybatch_batch_size_items"].observe(batch.num_items)
        h["raybatch_batch_cost"].observe(batch.cost)
        waits, bounds = self._waits, self._wait_bounds
        for seconds, level in zip(batch.queue_waits_s, batch.levels):
            b = waits[level]
            b.counts[bisect_left(bounds, seconds)] += 1
            b.sum += seconds

    def batch_done(self, batch: BatchDone) -> None:
        self._hists["raybatch_batch_latency_seconds"].observe(batch.latency_s)

    def step_done(self, step: StepDone) -> None:
        ttft = self._hists["raybatch_generation_ttft_seconds"]
        for seconds in step.first_text_s:
            ttft.observe(seconds)
        if step.inter_token_s is not None:
            self._hists["raybatch_generation_inter_token_seconds"].observe(step.inter_token_s)

    def refused(self, outcomes: Iterable[str]) -> None:
        """Requests the actor refused at submit (never opened on the host)."""
        refused = self._refused
        for o in outcomes:
            refused[o] = refused.get(o, 0) + 1

    # -- every metrics.interval_s: all of it to Ray ----------------------------------------
    def publish(self, snap: HostSnapshot, pool: PoolSnapshot | None = None) -> None:
        """Send the sampled histograms, the increments of every count since the last
        call, and the gauges."""
        tags = self._tags
        for name, buckets in self._hists.items():
            if self.kind == "iterative" or "generation" not in name:
                metric(name).publish(buckets, tags)
        wait = metric("raybatch_queue_wait_seconds")
        for level, buckets in self._waits.items():
            wait.publish(buckets, self._level_tags[level])
        outcomes = dict(snap.outcomes)
        for o, n in self._refused.items():
            outcomes[o] = outcomes.get(o, 0) + n
        add_increments(metric("raybatch_requests_total"), outcomes,
                       self._last.setdefault("outcomes", {}), self._outcome_tags.__getitem__)
        add_increments(metric("raybatch_batches_total"), self._reasons,
                       self._last.setdefault("reasons", {}), self._reason)
        counts = {"raybatch_replica_deaths_total": snap.replica_deaths,
                  "raybatch_retried_batches_total": snap.retried_batches,
                  "raybatch_sequences_lost_total": snap.sequences_lost,
                  "raybatch_sequences_idle_expired_total": snap.sequences_idle_expired,
                  "raybatch_generation_tokens_total": snap.tokens_generated,
                  "raybatch_generation_cancelled_total": snap.generations_cancelled}
        last = self._last.setdefault("counts", {})
        for name, value in counts.items():
            grown = value - last.get(name, 0)
            if grown > 0:
                metric(name).inc(grown, tags)
                last[name] = value
        self._publish_gauges(snap, pool)

    def _publish_gauges(self, snap: HostSnapshot, pool: PoolSnapshot | None) -> None:
        tags = self._tags
        if snap.live_sequences is not None:
            metric("raybatch_sequences_live").set(snap.live_sequences, tags)
        if snap.active_sequences is not None:
            metric("raybatch_generation_active_sequences").set(snap.active_sequences, tags)
        requests, items = metric("raybatch_queued_requests"), metric("raybatch_queued_items")
        for depth in snap.queued:
            level_tags = self._level_tags.get(depth.level)
            if level_tags is not None:
                requests.set(depth.requests, level_tags)
                items.set(depth.items, level_tags)
        inflight = metric("raybatch_inflight_batches")
        for name, n in snap.inflight:
            inflight.set(n, {**tags, "replica": self._replica_prefix + name})
        if pool is not None:
            metric("raybatch_replicas_desired").set(pool.desired, tags)
            metric("raybatch_replicas_running").set(pool.running, tags)
            metric("raybatch_replicas_pending").set(pool.pending, tags)
            demand = metric("raybatch_replicas_pending_demand")
            for resource, amount in pool.demand.items():
                demand.set(pool.pending * amount, {**tags, "resource": resource})


async def every(interval_s: float, flush: Callable[[], None],
                sleep: Callable[[float], Awaitable[Any]] = asyncio.sleep) -> None:
    """Call `flush` every `interval_s` until cancelled; a flush that raises is logged
    and the next one tries again (a metrics loop must not die)."""
    while True:
        await sleep(interval_s)
        try:
            flush()
        except Exception:
            log.exception("exporting metrics failed")


class HttpCounts:
    """Exports an ingress's cumulative response counts per (route template, status),
    kept in a plain dict by the HTTP front, as increments: call `flush()` on a timer
    (not per request). Keys may be added while it runs; counts must only grow.

    >>> counts = {("/v2/models/{model}/infer", 200): 0}
    >>> # flusher = HttpCounts(counts); task = create_task(every(1.0, flusher.flush))
    """

    def __init__(self, counts: Mapping[tuple[str, int | str], int]) -> None:
        self._counts = counts
        self._last: dict[tuple[str, int | str], int] = {}
        self._tags: dict[tuple[str, int | str], dict[str, str]] = {}

    def _labels(self, key: tuple[str, int | str]) -> dict[str, str]:
        tags = self._tags.get(key)
        if tags is None:
            tags = self._tags[key] = {"route": key[0], "status": str(key[1])}
        return tags

    def flush(self) -> None:
        add_increments(metric("raybatch_http_requests_total"), dict(self._counts),
                       self._last, self._labels)
