"""When a replica's ready sequences form a batch, and which rows it has.

Pure functions over one replica's ready set, for `SequenceBatcher.next_batch`.
Due, checked in this order: drain (the host is closing), full
(`max_batch_size` ready), preferred (the largest preferred size ready), delay
(the oldest ready request waited `max_queue_delay_s`; then the largest
preferred size that fits is taken), deadline (a ready request would expire
before the delay runs out). Rows: direct sends every ready slot, as rows
0..highest ready slot (the slots between are rows that are not ready);
oldest sends the oldest ready heads, one per sequence, up to the target size.
"""

from __future__ import annotations

import math
from collections.abc import Hashable, Iterable

from batching.sequence.policy import SequencePolicy
from batching.sequence.state import Replica, Seq, ready_s
from batching.sequence.types import SequenceBatch, SequenceRequest
from batching.types import FlushReason


def delay_send_s(rep: Replica, policy: SequencePolicy, draining: bool) -> float:
    """When the oldest ready request of `rep` has waited the queue delay."""
    if draining:
        return -math.inf
    return min(ready_s(s) for s in rep.ready) + policy.max_queue_delay_s


def due(rep: Replica, policy: SequencePolicy, draining: bool,
        now: float) -> tuple[FlushReason, int] | None:
    """Why `rep`'s ready rows go now, and the most rows to take; None: not yet."""
    n = len(rep.ready)
    if draining:
        return FlushReason.DRAIN, policy.max_batch_size
    if n >= policy.max_batch_size:
        return FlushReason.FULL, policy.max_batch_size
    if policy.largest_preferred is not None and n >= policy.largest_preferred:
        return FlushReason.PREFERRED, policy.largest_preferred
    send_s = delay_send_s(rep, policy, draining)
    if send_s <= now:
        fitting = [s for s in policy.preferred_batch_sizes if s <= n]
        return FlushReason.DELAY, (fitting[-1] if fitting else policy.max_batch_size)
    if min(s.queue[0].deadline_s for s in rep.ready) <= send_s:
        return FlushReason.DEADLINE, policy.max_batch_size
    return None


def choose(rep: Replica, direct: bool, target: int) -> tuple[list[Seq], list[Seq | None]]:
    """The sequences whose heads run, and the batch's rows (None: a row not ready)."""
    if direct:
        chosen = sorted(rep.ready, key=lambda s: s.slot)
        rows: list[Seq | None] = [None] * (chosen[-1].slot + 1)
        for seq in chosen:
            rows[seq.slot] = seq
        return chosen, rows
    chosen = sorted(rep.ready, key=lambda s: (ready_s(s), s.queue[0].seqno))[:target]
    return chosen, list(chosen)


def build_batch(batch_id: int, key: Hashable, rows: list[SequenceRequest | None],
                slots: Iterable[int], reason: FlushReason, now: float) -> SequenceBatch:
    """The batch whose row i runs `rows[i]` (None: a row that is not ready)."""
    return SequenceBatch(
        id=batch_id, replica=key,
        request_ids=tuple(None if r is None else r.id for r in rows),
        sequence_ids=tuple(None if r is None else r.sequence_id for r in rows),
        start=tuple(r is not None and r.start for r in rows),
        end=tuple(r is not None and r.end for r in rows),
        ready=tuple(r is not None for r in rows),
        slots=tuple(slots), reason=reason, created_s=now,
    )
