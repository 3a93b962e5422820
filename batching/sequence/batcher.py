"""Sequence batching for stateful models, as a pure state machine handed `now`.

A sequence's state lives on one replica, so a start takes a slot on the
replica with the most free slots (ties: the first added) or waits, FIFO, for
one; every later request of the sequence goes to that replica and slot.
Invariants: a sequence's requests run in submission order and never two at
once (the next is not dispatched before the previous completed); a replica
never holds more live sequences than `sequences_per_replica`.

`next_batch` runs in phases: expire (requests past their timeout), idle
(sequences idle for `max_sequence_idle_s` end, and the host is told to drop
their state), then per replica with a free batch place: due? → form (both
in `batching.sequence.rows`).

Withdrawn requests (timed out or cancelled before dispatch): a start's
sequence never starts and the requests queued behind it fail with
UnknownSequence; an end still ends its sequence once what is before it has
run, and the replica is told to drop the state; any other request just fails
and the sequence goes on without it.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import Counter
from collections.abc import Callable, Collection, Hashable, Mapping
from typing import Any

from batching.errors import DeadlineExceeded, InvalidRequest, UnknownSequence
from batching.sequence import rows
from batching.sequence.policy import SequencePolicy, SequenceStrategy
from batching.sequence.slots import SlotTable, lost_error
from batching.sequence.state import Entry, Phase, Replica, Seq, validate
from batching.sequence.types import SequenceBatch, SequenceId, SequenceRequest
from batching.stats import BatchStats
from batching.types import Failure, FlushReason, RequestId

__all__ = ["SequenceBatch", "SequenceBatcher", "SequenceRequest"]

_COUNTS = ("sequences_started", "sequences_ended", "sequences_idle_freed", "sequences_lost",
           "expired", "cancelled")


class SequenceBatcher:
    """Gathers the requests of live sequences into per-replica batches.

    >>> q = SequenceBatcher(SequencePolicy(max_batch_size=2))
    >>> q.add_replica("r0")
    >>> q.submit(SequenceRequest("a", 7, 5, start=True), now=0.0)
    >>> b = q.next_batch(now=0.0, free={"r0": 1})
    >>> (b.replica, b.request_ids, b.start)
    ('r0', ('a',), (True,))
    """

    def __init__(self, policy: SequencePolicy) -> None:
        self.policy = policy
        self.batch_stats = BatchStats()
        self.counts: Counter[str] = Counter(dict.fromkeys(_COUNTS, 0))
        self._direct = policy.strategy is SequenceStrategy.DIRECT
        self._table = SlotTable(policy.sequences_per_replica, policy.max_pending_sequences,
                                policy.max_sequence_idle_s)
        self._queued: dict[RequestId, tuple[Seq, Entry]] = {}
        self._expiry: list[tuple[float, int, Entry, Seq]] = []  # heap, lazily cleaned
        self._idle: list[tuple[float, int, Seq]] = []  # heap, lazily cleaned
        self._inflight: dict[int, tuple[SequenceBatch, list[tuple[Seq, Entry]]]] = {}
        self._failures: list[Failure] = []
        self._blocked: set[Hashable] = set()  # replicas without a free batch place
        self._draining = False
        self._now = 0.0  # the latest `now` seen, for calls that are not handed one
        self._seqno = itertools.count()
        self._batch_ids = itertools.count()

    # -- state the host may read --------------------------------------------------------
    @property
    def queued_requests(self) -> int:
        return len(self._queued)

    @property
    def live_sequences(self) -> int:
        return self._table.live

    @property
    def pending_sequences(self) -> int:
        return len(self._table.pending)

    @property
    def stats(self) -> dict[str, Any]:
        return {**self.batch_stats.as_dict(), **self.counts,
                "queued_requests": self.queued_requests, "live_sequences": self.live_sequences,
                "pending_sequences": self.pending_sequences,
                "inflight_batches": len(self._inflight)}

    def take_failures(self) -> list[Failure]:
        """Requests ended without running (expired, lost, never started) since the last call."""
        out, self._failures = self._failures, []
        return out

    def take_releases(self) -> dict[Hashable, list[SequenceId]]:
        """Sequences ended without their end request completing, whose state each replica
        must drop (idle timeout, a withdrawn or failed end, a failed start)."""
        out = dict(self._table.releases)
        self._table.releases.clear()
        return out

    # -- replicas -----------------------------------------------------------------------
    def add_replica(self, key: Hashable, now: float | None = None) -> None:
        self._table.add_replica(key)
        self._admit(self._at(now))

    def remove_replica(self, key: Hashable, now: float | None = None) -> list[SequenceId]:
        """Forget `key`; returns the sequences lost with it (their state was there): what
        they have queued fails with SequenceLost, and so does any later request naming them
        without sequence_start."""
        self._blocked.discard(key)
        lost = self._table.remove_replica(key)
        self._lose(lost)
        self._admit(self._at(now))
        return [seq.id for seq in lost]

    # -- inputs -------------------------------------------------------------------------
    def submit(self, request: SequenceRequest, now: float) -> None:
        """Queue `request`; raises InvalidRequest, UnknownSequence, SequenceLost or
        QueueFull at once and then keeps nothing."""
        validate(request)
        if request.id in self._queued:
            raise InvalidRequest(f"request id {request.id!r} is already queued: ids must be unique")
        now = self._at(now)
        seq = self._table.sequence_for(request)
        entry = Entry(request, now, now + (request.timeout_s or math.inf), next(self._seqno))
        seq.queue.append(entry)
        seq.closing = request.end
        seq.idle_at = None
        self._queued[request.id] = (seq, entry)
        if entry.deadline_s < math.inf:
            heapq.heappush(self._expiry, (entry.deadline_s, entry.seqno, entry, seq))
        self._admit(now)  # a new start takes a free slot now, if it is first in line
        self._refresh(seq, now)

    def cancel(self, request_id: RequestId, now: float) -> bool:
        """Withdraw a queued request; False if it is not queued (running or ended)."""
        found = self._queued.get(request_id)
        if found is None:
            return False
        self.counts["cancelled"] += 1
        self._withdraw(*found, self._at(now), None, "was cancelled")
        return True

    def complete(self, batch_id: int, now: float,
                 lost: Collection[SequenceId] = ()) -> SequenceBatch:
        """Record that `batch_id` returned: its sequences may run their next request;
        those whose request had `end` are freed (the replica dropped their state). `lost`:
        sequences the replica had no state for (it restarted); they are lost."""
        batch, taken = self._inflight.pop(batch_id)
        now = self._at(now)
        for seq, entry in taken:
            if not self._settle_row(seq, now):
                continue
            if seq.id in lost:
                self._lose([seq])
            elif entry.request.end:
                self.counts["sequences_ended"] += 1
                self._end(seq, now, release=False)
            else:
                self._refresh(seq, now)
        if lost:
            self._admit(now)
        return batch

    def fail(self, batch_id: int, now: float) -> SequenceBatch:
        """Record that `batch_id` failed: the model's state did not advance. A failed start
        never started its sequence; a failed end still ends it (the state is released)."""
        batch, taken = self._inflight.pop(batch_id)
        now = self._at(now)
        for seq, entry in taken:
            if not self._settle_row(seq, now):
                continue
            if entry.request.start:
                self._drop_unstarted(seq, now, f"{entry.request.id!r} failed", release=True)
            elif entry.request.end:
                self._end(seq, now, release=True)
            else:
                self._refresh(seq, now)
        return batch

    def drain(self) -> None:
        """From now on send whatever is ready without waiting (the host is closing)."""
        self._draining = True

    # -- decisions ----------------------------------------------------------------------
    def next_batch(self, now: float, free: Mapping[Hashable, int]) -> SequenceBatch | None:
        """The batch to run now, or None; `free` = batches each replica can take now."""
        now = self._at(now)
        self._expire(now)
        self._end_idle(now)
        replicas = self._table.replicas
        self._blocked = {k for k in replicas if free.get(k, 0) <= 0}
        for rep in replicas.values():
            if rep.ready and rep.key not in self._blocked:
                due = rows.due(rep, self.policy, self._draining, now)
                if due is not None:
                    return self._form(rep, *due, now)
        return None

    def deadline(self) -> float | None:
        """When to call `next_batch` again if nothing is submitted or completed before."""
        while self._expiry and self._expiry[0][2].removed:
            heapq.heappop(self._expiry)
        while self._idle and self._idle[0][2].idle_at != self._idle[0][0]:
            heapq.heappop(self._idle)
        times = [h[0][0] for h in (self._expiry, self._idle) if h]
        times += [rows.delay_send_s(r, self.policy, self._draining)
                  for r in self._table.replicas.values() if r.ready and r.key not in self._blocked]
        return min(times, default=None)

    # -- phases of next_batch ------------------------------------------------------------
    def _expire(self, now: float) -> None:
        while self._expiry and self._expiry[0][0] <= now:
            _, _, entry, seq = heapq.heappop(self._expiry)
            if entry.removed:
                continue
            self.counts["expired"] += 1
            waited_ms = (now - entry.arrival_s) * 1e3
            self._withdraw(seq, entry, now, DeadlineExceeded(
                f"request {entry.request.id!r} of sequence {seq.id!r} waited {waited_ms:.1f} ms "
                "and passed its timeout before it could run; raise its timeout or add replicas"
            ), "timed out")

    def _end_idle(self, now: float) -> None:
        while self._idle and self._idle[0][0] <= now:
            at, _, seq = heapq.heappop(self._idle)
            if seq.idle_at == at:  # else it got busy (or ended) since
                self.counts["sequences_idle_freed"] += 1
                self._end(seq, now, release=True)

    def _form(self, rep: Replica, reason: FlushReason, target: int, now: float) -> SequenceBatch:
        chosen, row_seqs = rows.choose(rep, self._direct, target)
        taken = [(seq, self._take_head(rep, seq)) for seq in chosen]
        heads = {seq: entry.request for seq, entry in taken}
        slots = range(len(row_seqs)) if self._direct else [s.slot for s in chosen]
        batch = rows.build_batch(next(self._batch_ids), rep.key,
                                 [None if s is None else heads[s] for s in row_seqs], slots,
                                 reason, now)
        self._inflight[batch.id] = (batch, taken)
        self.batch_stats.record(batch)  # type: ignore[arg-type]  # num_items and reason
        return batch

    # -- bookkeeping --------------------------------------------------------------------
    def _at(self, now: float | None) -> float:
        if now is not None:
            self._now = now
        return self._now

    def _admit(self, now: float) -> None:
        for seq in self._table.admit(now):
            self._refresh(seq, now)

    def _refresh(self, seq: Seq, now: float) -> None:
        """Put `seq` in or out of its replica's ready set, and time its idleness."""
        if seq.phase is not Phase.LIVE:
            return
        rep = self._table.replicas[seq.replica]
        if seq.running is None and seq.queue:
            rep.ready[seq] = None
            return
        rep.ready.pop(seq, None)
        if seq.running is not None:
            return
        if seq.closing:  # its end was withdrawn and nothing of it is left to run
            self._end(seq, now, release=True)
        elif seq.idle_at is None:
            seq.idle_at = now + self.policy.max_sequence_idle_s
            heapq.heappush(self._idle, (seq.idle_at, next(self._seqno), seq))

    def _take_head(self, rep: Replica, seq: Seq) -> Entry:
        entry = seq.queue.popleft()
        entry.removed = True
        del self._queued[entry.request.id]
        seq.running = entry
        rep.ready.pop(seq, None)
        if entry.request.start:
            seq.started = True
            self.counts["sequences_started"] += 1
        return entry

    def _settle_row(self, seq: Seq, now: float) -> bool:
        """A row of `seq` came back; False if the sequence ended meanwhile (lost)."""
        if seq.phase is Phase.ENDED:
            return False
        seq.running, seq.free_s = None, now
        return True

    def _withdraw(self, seq: Seq, entry: Entry, now: float, error: BaseException | None,
                  why: str) -> None:
        entry.removed = True
        seq.queue.remove(entry)
        del self._queued[entry.request.id]
        if error is not None:
            self._failures.append(Failure(entry.request.id, error))
        if entry.request.start:
            self._drop_unstarted(seq, now, f"{entry.request.id!r} {why}", release=False)
        else:
            self._refresh(seq, now)

    def _drop_unstarted(self, seq: Seq, now: float, why: str, *, release: bool) -> None:
        """The start of `seq` never ran (or failed): what is queued behind it fails too."""
        self._fail_queue(seq, lambda: UnknownSequence(
            f"sequence {seq.id!r} never started: its start request {why}; send "
            "sequence_start again"
        ))
        self._end(seq, now, release=release)

    def _end(self, seq: Seq, now: float, *, release: bool) -> None:
        self._table.end(seq, release=release)
        self._admit(now)  # a waiting start takes the freed slot

    def _lose(self, seqs: list[Seq]) -> None:
        for seq in seqs:
            self.counts["sequences_lost"] += 1
            self._fail_queue(seq, lambda sid=seq.id: lost_error(sid))
            if seq.phase is not Phase.ENDED:
                self._table.lose(seq)

    def _fail_queue(self, seq: Seq, error: Callable[[], BaseException]) -> None:
        for entry in seq.queue:  # an error each: one exception object per future
            entry.removed = True
            del self._queued[entry.request.id]
            self._failures.append(Failure(entry.request.id, error()))
        seq.queue.clear()
