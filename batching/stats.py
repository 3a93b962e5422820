"""Counters of what a batcher did: batches by size and flush reason, time spent.

Triton reports execution counts and compute time per batch size, and request
success / failure / queue time; Raybatch records the same (so its statistics
endpoint can speak Triton's format) and adds why each batch left the queue.
Plain numbers and dicts, so a host can ship them as JSON.
"""

from __future__ import annotations

import time
from collections import Counter
from dataclasses import dataclass, field

from batching.types import Batch


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

    def record(self, batch: Batch) -> None:
        self.batches += 1
        self.items += batch.num_items
        self.by_size[batch.num_items] += 1
        self.by_reason[batch.reason.value] += 1

    def record_compute(self, num_items: int, compute_s: float) -> None:
        self.compute_s_by_size[num_items] += compute_s
        self.last_inference_ms = int(time.time() * 1e3)

    def record_queue(self, wait_s: float) -> None:
        self.queue_count += 1
        self.queue_s += wait_s

    def record_outcome(self, ok: bool, duration_s: float) -> None:
        if ok:
            self.success_count += 1
            self.success_s += duration_s
        else:
            self.fail_count += 1
            self.fail_s += duration_s

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
            "last_inference_ms": self.last_inference_ms,
        }
