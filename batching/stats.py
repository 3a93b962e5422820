"""Counters of what a batcher did: batches by size and flush reason, time spent.

Triton reports execution counts and compute time per batch size, and request
success / failure / queue time; Raybatch records the same (so its statistics
endpoint can speak Triton's format) and adds why each batch left the queue.
Plain numbers and dicts, so a host can ship them as JSON. Queue waits are also
kept as bucket counts (`WaitHistogram`), so `raybatch status --watch` can show
their quantiles without a Prometheus.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field

from batching.types import Batch

# Bucket upper bounds for latencies, 100 us to 30 s: batching waits are sub-millisecond
# to seconds. Prometheus's `le` buckets: a value equal to a bound counts in that bucket.
LATENCY_BUCKETS_S = (0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1,
                     0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0)


class WaitHistogram:
    """Counts of values per latency bucket: `counts[i]` holds values in
    (bounds[i-1], bounds[i]], the last one those above every bound."""

    __slots__ = ("counts",)

    def __init__(self) -> None:
        self.counts = [0] * (len(LATENCY_BUCKETS_S) + 1)

    def observe(self, value_s: float, n: int = 1) -> None:
        self.counts[bisect_left(LATENCY_BUCKETS_S, value_s)] += n


def quantile(q: float, counts: Sequence[float],
             bounds: Sequence[float] = LATENCY_BUCKETS_S) -> float | None:
    """The q-quantile of bucketed values, interpolated linearly inside its bucket, as
    Prometheus's histogram_quantile does; None when there are none.

    >>> quantile(0.5, [0, 0, 0, 4] + [0] * 14)  # all four in (0.0005, 0.001]
    0.00075
    """
    total = sum(counts)
    if total <= 0:
        return None
    rank, seen = q * total, 0.0
    for i, n in enumerate(counts):
        if n and seen + n >= rank:
            if i == len(bounds):
                return bounds[-1]  # above every bound: the highest one, as Prometheus says
            lo = bounds[i - 1] if i else 0.0
            return lo + (bounds[i] - lo) * (rank - seen) / n
        seen += n
    return bounds[-1]


@dataclass(slots=True)
class BatchStats:
    batches: int = 0
    items: int = 0
    by_size: Counter = field(default_factory=Counter)
    by_reason: Counter = field(default_factory=Counter)
    compute_s_by_size: Counter = field(default_factory=Counter)
    success_count: int = 0
    success_s: float = 0.0
    fail_count: int = 0
    fail_s: float = 0.0
    queue_count: int = 0
    queue_s: float = 0.0
    last_inference_ms: int = 0
    queue_hist: WaitHistogram = field(default_factory=WaitHistogram)

    def record(self, batch: Batch) -> None:
        self.batches += 1
        self.items += batch.num_items
        self.by_size[batch.num_items] += 1
        self.by_reason[batch.reason.value] += 1

    def record_compute(self, num_items: int, compute_s: float) -> None:
        self.compute_s_by_size[num_items] += compute_s
        self.last_inference_ms = int(time.time() * 1e3)

    def record_queue(self, wait_s: float, requests: int = 1) -> None:
        self.queue_count += requests
        self.queue_s += wait_s * requests
        self.queue_hist.observe(wait_s, requests)

    def record_outcome(self, ok: bool, duration_s: float, requests: int = 1) -> None:
        if ok:
            self.success_count += requests
            self.success_s += duration_s * requests
        else:
            self.fail_count += requests
            self.fail_s += duration_s * requests

    @property
    def mean_batch_size(self) -> float:
        return self.items / self.batches if self.batches else 0.0

    def as_dict(self) -> dict:
        return {
            "batches": self.batches,
            "items": self.items,
            "mean_batch_size": round(self.mean_batch_size, 3),
            "by_size": dict(sorted(self.by_size.items())),
            "by_reason": dict(self.by_reason),
            "compute_s_by_size": dict(sorted(self.compute_s_by_size.items())),
            "success": {"count": self.success_count, "s": self.success_s},
            "fail": {"count": self.fail_count, "s": self.fail_s},
            "queue": {"count": self.queue_count, "s": self.queue_s},
            "queue_hist": list(self.queue_hist.counts),
            "last_inference_ms": self.last_inference_ms,
        }
