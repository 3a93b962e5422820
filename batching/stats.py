"""Counters of what a batcher did: batches by size and by flush reason.

Triton reports execution counts per batch size; Raybatch does too, and adds
why each batch left the queue. Plain dicts so a host can ship them as JSON.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

from batching.types import Batch


@dataclass(slots=True)
class BatchStats:
    batches: int = 0
    items: int = 0
    by_size: Counter = field(default_factory=Counter)
    by_reason: Counter = field(default_factory=Counter)

    def record(self, batch: Batch) -> None:
        self.batches += 1
        self.items += batch.num_items
        self.by_size[batch.num_items] += 1
        self.by_reason[batch.reason.value] += 1

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
        }
