"""Values on the sequence batcher's hot path: a request of a sequence, a batch of rows.

A `SequenceRequest` carries ONE item (no batch dimension) and the controls of
its sequence: the correlation id, start and end. A `SequenceBatch` is one row
per slot (direct) or per sequence (oldest), each with its controls, so the
model sees for every row whether it starts, ends, or is ready at all.
Requests are matched to rows by `RequestId`, never by position in a queue.
"""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass
from typing import Any

from batching.types import FlushReason, RequestId

SequenceId = int | str


@dataclass(frozen=True, slots=True)
class SequenceRequest:
    """One step of a sequence: `item` is a single input, without a batch dimension.

    `sequence_id` is the correlation id (int or str; 0 and "" mean none and are
    refused). `start` begins the sequence (its state is reset), `end` ends it (its
    state is dropped after this request). `timeout_s` counts from submission.

    >>> SequenceRequest("r1", 7, 5, start=True).sequence_id
    7
    """

    id: RequestId
    sequence_id: SequenceId
    item: Any
    start: bool = False
    end: bool = False
    timeout_s: float | None = None


@dataclass(frozen=True, slots=True)
class SequenceBatch:
    """What the sequence batcher hands the host to run on `replica`.

    One entry per row in every tuple. direct: row i is slot i of the replica and a
    row without a ready request has `ready=False` and `request_id=None`; oldest:
    every row is ready and `slots` holds each sequence's candidate index.
    """

    id: int
    replica: Hashable
    request_ids: tuple[RequestId | None, ...]
    sequence_ids: tuple[SequenceId | None, ...]
    start: tuple[bool, ...]
    end: tuple[bool, ...]
    ready: tuple[bool, ...]
    slots: tuple[int, ...]
    reason: FlushReason
    created_s: float

    @property
    def rows(self) -> int:
        return len(self.ready)

    @property
    def num_items(self) -> int:
        """Ready rows: the requests this batch runs."""
        return sum(self.ready)

    @property
    def ids(self) -> list[RequestId]:
        """Request ids of the ready rows, in row order."""
        return [r for r in self.request_ids if r is not None]
