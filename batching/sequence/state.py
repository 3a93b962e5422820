"""The sequence batcher's bookkeeping records: a queued request, a sequence, a replica.

Kept apart from `batching.sequence.batcher` so the scheduler reads as its phases. A
sequence moves PENDING (its start waits for a slot) → LIVE (it holds a slot on
one replica, for good) → ENDED (ended, idle-freed, never started, or lost with
its replica). ENDED is final: a record still referenced by an in-flight batch
after its sequence ended is recognised by it and ignored, so a fresh sequence
reusing the correlation id is never touched by the old one's batches.
"""

from __future__ import annotations

import enum
from collections import deque
from collections.abc import Hashable
from dataclasses import dataclass, field
from numbers import Integral

from batching.errors import InvalidRequest
from batching.sequence.types import SequenceId, SequenceRequest


class Phase(enum.Enum):
    PENDING = "pending"  # its start request waits for a free slot on some replica
    LIVE = "live"  # holds slot `slot` on replica `replica`
    ENDED = "ended"  # gone: its record is kept only by batches still in flight


@dataclass(slots=True, eq=False)
class Entry:
    """A request of a sequence, queued until it is dispatched or withdrawn."""

    request: SequenceRequest
    arrival_s: float
    deadline_s: float  # math.inf without a timeout
    seqno: int  # submission order, across all sequences
    removed: bool = False  # dispatched or withdrawn: skipped where it is lazily referenced


@dataclass(slots=True, eq=False)
class Seq:
    """One sequence: its queued requests in submission order, and where it lives."""

    id: SequenceId
    queue: deque[Entry] = field(default_factory=deque)
    phase: Phase = Phase.PENDING
    replica: Hashable | None = None
    slot: int = -1
    running: Entry | None = None  # at most one request of a sequence runs at a time
    started: bool = False  # its start was dispatched: a replica may hold its state
    closing: bool = False  # its end request was accepted: no further request is
    free_s: float = 0.0  # when it last got a slot or finished a request
    idle_at: float | None = None  # when the idle timeout frees it; None while busy


@dataclass(slots=True, eq=False)
class Replica:
    """A replica's slots (direct) or candidate places (oldest) and its ready sequences."""

    key: Hashable
    slots: list[Seq | None]
    ready: dict[Seq, None] = field(default_factory=dict)  # insertion-ordered set
    free: int = 0

    def place(self, seq: Seq, now: float) -> None:
        slot = self.slots.index(None)
        self.slots[slot] = seq
        self.free -= 1
        seq.phase, seq.replica, seq.slot, seq.free_s = Phase.LIVE, self.key, slot, now

    def vacate(self, seq: Seq) -> None:
        self.slots[seq.slot] = None
        self.free += 1
        self.ready.pop(seq, None)


def ready_s(seq: Seq) -> float:
    """When the head request of `seq` became ready: it arrived and its predecessor was done."""
    return max(seq.queue[0].arrival_s, seq.free_s)


def validate(request: SequenceRequest) -> None:
    """Raise InvalidRequest for a malformed request (before anything is kept)."""
    sid = request.sequence_id
    if isinstance(sid, bool) or not isinstance(sid, Integral | str) or sid == 0 or sid == "":
        raise InvalidRequest(
            f"sequence_id={sid!r} is not a correlation id: use a non-zero integer or a "
            "non-empty string (0 and \"\" mean 'no sequence')"
        )
    if request.timeout_s is not None and not request.timeout_s > 0:
        raise InvalidRequest(f"timeout_s={request.timeout_s} must be > 0 seconds, or left out")

