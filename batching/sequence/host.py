"""`SequenceHost`: the asyncio shell that runs a `SequenceBatcher` against stateful replicas.

The twin of `BatchHost` for sequence batching: the host alone reads the clock,
arms the one timer at the engine's `deadline()`, pumps once per loop tick and
turns outcomes into futures. Replicas are `SequenceReplicaClient`s, each
holding the state of the sequences the engine placed on it (a `StateStore`).

No retry here, unlike `BatchHost`: a replica that dies (`ReplicaDied`) took
its sequences' state with it. It is removed (`on_replica_died` lets the pool
start a replacement); its in-flight rows and its sequences' queued requests
fail with SequenceLost, later requests naming them fail with SequenceLost at
submit, and new sequences go to the live replicas. A model error fails that
batch's requests only. Sequences ended without their end request running
(idle timeout, withdrawn end) are released on their replica, fire and forget,
and always before any later batch is sent (tasks start in creation order), so
a replica never runs a restarted sequence before dropping its old state.
Metrics go to the `recorder` it is handed, per batch, and to `snapshot()`.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Collection
from typing import Any, Protocol

from batching.errors import (
    BatchSizeMismatch,
    Cancelled,
    InvalidRequest,
    SequenceLost,
    ServiceClosed,
)
from batching.ledger import ItemFailed
from batching.loop import LoopHost, OpenRequest, ReplicaDied, ReplicaSlot
from batching.metrics import (
    NULL_RECORDER,
    BatchDone,
    BatchSent,
    HostSnapshot,
    LevelDepth,
    Recorder,
    outcome_of,
)
from batching.sequence.batcher import SequenceBatcher
from batching.sequence.policy import SequencePolicy
from batching.sequence.stateful import SequenceBatchInput, make_batch_input
from batching.sequence.types import SequenceBatch, SequenceId, SequenceRequest
from batching.types import RequestId

log = logging.getLogger(__name__)

__all__ = ["ReplicaDied", "SequenceHost", "SequenceReplicaClient"]


class SequenceReplicaClient(Protocol):
    name: str

    async def run(self, batch: SequenceBatchInput) -> tuple[list, float]:
        """Run one batch; returns (one result per row, compute seconds). Raises
        ReplicaDied when the replica is gone, else the model's error."""
        ...

    async def release(self, sequence_ids: list) -> None:
        """Drop the state of `sequence_ids` (they ended without their end request)."""
        ...




class SequenceHost(LoopHost[SequenceBatcher]):
    """Runs the requests of stateful sequences on replicas that keep their state.

    >>> # host = SequenceHost(SequencePolicy(max_batch_size=8)); host.add_replica(client)
    >>> # out = await host.submit(SequenceRequest("r1", 42, np.array([5]), start=True))
    """

    def __init__(self, policy: SequencePolicy, *, max_inflight: int = 2,
                 clock: Callable[[], float] = time.monotonic,
                 on_replica_died: Callable[[Any], None] | None = None,
                 recorder: Recorder = NULL_RECORDER) -> None:
        if max_inflight < 1:
            raise ValueError(f"max_inflight={max_inflight} must be >= 1")
        super().__init__(clock)
        self.policy = policy
        self.recorder = recorder
        self.outcomes: dict[str, int] = {}  # requests ended, by outcome (batching.metrics)
        self.engine = SequenceBatcher(policy)
        self.max_inflight = max_inflight
        self._on_replica_died = on_replica_died or (lambda client: None)
        self._open: dict[RequestId, OpenRequest] = {}
        self._inflight: dict[int, SequenceBatch] = {}
        self.replica_deaths = 0
        self.releases_sent = 0
        self.release_failures = 0

    # -- replicas -------------------------------------------------------------------------
    _slots: list[ReplicaSlot]

    def add_replica(self, client: SequenceReplicaClient) -> None:
        slot = ReplicaSlot(client)
        self._slots.append(slot)
        self.engine.add_replica(slot, self._clock())
        self._schedule_pump()

    def remove_replica(self, client: SequenceReplicaClient) -> None:
        """Stop using `client`: its sequences are lost (their state is there); its batches
        in flight finish or fail on their own."""
        slot = self._slot_of(client)
        if slot is not None:
            self._drop(slot)

    def _drop(self, slot: ReplicaSlot) -> None:
        self._slots.remove(slot)
        lost = self.engine.remove_replica(slot, self._clock())
        if lost:
            log.warning("replica %s removed: %d sequences lost (%s)", slot.client.name,
                        len(lost), lost[:8])
        self._schedule_pump()  # settles their queued requests

    def outstanding(self, client: SequenceReplicaClient) -> int:
        slot = self._slot_of(client)
        return 0 if slot is None else slot.inflight

    @property
    def queued_work(self) -> int:
        return self.engine.queued_requests

    @property
    def open_requests(self) -> int:
        """Requests submitted that have no outcome yet."""
        return len(self._open)

    @property
    def busy(self) -> bool:
        """Live sequences hold state on their replicas: busy until they end."""
        return bool(self.engine.queued_requests or self.engine.live_sequences)

    # -- requests -------------------------------------------------------------------------
    def submit(self, request: SequenceRequest) -> asyncio.Future:
        """Queue `request`; its future's result is that request's output row. Raises
        UnknownSequence, SequenceLost, InvalidRequest, QueueFull or ServiceClosed at once."""
        if self.closed_reason is not None:
            raise ServiceClosed(self.closed_reason)
        if request.id in self._open:
            raise InvalidRequest(f"request id {request.id!r} is still open: ids must be unique")
        now = self._clock()
        # No await between engine.submit and registering the future, so an outcome can
        # never arrive for an id the host does not know.
        self.engine.submit(request, now)
        fut = self._loop.create_future()
        self._open[request.id] = OpenRequest(fut, request, now)
        self._idle.clear()
        self._schedule_pump()
        return fut

    def cancel(self, request_id: RequestId, why: str = "cancelled by its caller") -> None:
        """End a request with `Cancelled`; if still queued it never runs (a cancelled start
        never starts its sequence, a cancelled end still ends it)."""
        if request_id in self._open:
            self.engine.cancel(request_id, self._clock())
            self._resolve(request_id, error=Cancelled(f"request {request_id!r} {why}"))
            self._schedule_pump()  # a slot may have freed, requests behind a start failed

    def abort(self, error: BaseException) -> None:
        """Fail every open request with `error` now."""
        now = self._clock()
        for rid in list(self._open):
            self.engine.cancel(rid, now)
            self._resolve(rid, error=error)
        self.engine.take_failures()  # requests behind cancelled starts: already failed above
        self._cancel_timer()

    def wake(self) -> None:
        """Look at the clock now, as the timer does (for hosts driven by a fake clock)."""
        self._pump()

    def snapshot(self) -> HostSnapshot:
        """Queue depth, batches in flight, live sequences and cumulative counts."""
        e = self.engine
        queued = e.queued_requests
        return HostSnapshot(
            queued=(LevelDepth(1, queued, queued),),
            inflight=tuple((s.client.name, s.inflight) for s in self._slots),
            outcomes=dict(self.outcomes), replica_deaths=self.replica_deaths,
            live_sequences=e.live_sequences, sequences_lost=e.counts["sequences_lost"],
            sequences_idle_expired=e.counts["sequences_idle_freed"])

    def stats(self) -> dict[str, Any]:
        return {
            **self.engine.stats,
            "open_requests": len(self._open),
            "replicas": len(self._slots),
            "replica_deaths": self.replica_deaths,
            "releases_sent": self.releases_sent,
            "release_failures": self.release_failures,
            # of the requests counted under "fail" (Triton's statistics), those cancelled
            "cancelled": self.outcomes.get("cancelled", 0),
        }

    # -- the pump: the only place batches are formed ---------------------------------------
    def _pump(self) -> None:
        self._pump_scheduled = False
        now = self._clock()
        free = {s: self.max_inflight - s.inflight for s in self._slots}
        while (batch := self.engine.next_batch(now, free)) is not None:
            free[batch.replica] -= 1
            # Releases first: tasks start in creation order, so a replica drops a freed
            # sequence's state before it runs any later batch (one that may reuse its id).
            self._send_releases()
            self._dispatch(batch)
        for failure in self.engine.take_failures():
            self._resolve(failure.request_id, error=failure.error)
        self._send_releases()
        self._arm_timer(self.engine.deadline(), now)

    def _dispatch(self, batch: SequenceBatch) -> None:
        slot: ReplicaSlot = batch.replica  # type: ignore[assignment]  # the key is the slot
        open_, stats = self._open, self.engine.batch_stats
        waits = tuple(batch.created_s - open_[rid].submitted_s for rid in batch.ids)
        for wait in waits:
            stats.record_queue(wait)
        self.recorder.batch_sent(BatchSent(len(waits), float(len(waits)), batch.reason.value,
                                           waits, (1,) * len(waits)))
        # The inputs are built now: a request cancelled while the batch runs leaves _open.
        inputs = make_batch_input(batch, {rid: open_[rid].request.item for rid in batch.ids})
        self._inflight[batch.id] = batch
        slot.inflight += 1
        self._spawn(self._run(batch, slot, inputs))

    async def _run(self, batch: SequenceBatch, slot: ReplicaSlot,
                   inputs: SequenceBatchInput) -> None:
        try:
            results, compute_s = await slot.client.run(inputs)
            if len(results) != batch.rows:
                raise BatchSizeMismatch(
                    f"replica {slot.client.name} returned {len(results)} results for a batch "
                    f"of {batch.rows} rows: return one per row (None where not ready)")
        except ReplicaDied as e:
            slot.inflight -= 1
            self._replica_died(slot, batch, e)
            return
        except BaseException as e:  # the model's own error: this batch's requests only
            slot.inflight -= 1
            self._finish(batch, failed=True)
            self.recorder.batch_done(BatchDone(batch.num_items,
                                               self._clock() - batch.created_s, None))
            self._fail_rows(batch, lambda sid, e=e: e)
            self._schedule_pump()
            if isinstance(e, asyncio.CancelledError):
                raise
            return
        slot.inflight -= 1
        self.engine.batch_stats.record_compute(batch.num_items, compute_s)
        self.recorder.batch_done(BatchDone(batch.num_items, self._clock() - batch.created_s,
                                           compute_s))
        self._deliver(batch, results)
        self._schedule_pump()

    def _deliver(self, batch: SequenceBatch, results: list) -> None:
        lost: list[SequenceId] = []
        for rid, sid, r in zip(batch.request_ids, batch.sequence_ids, results):
            if rid is None:
                continue
            if isinstance(r, ItemFailed):
                if isinstance(r.error, SequenceLost):  # the replica restarted meanwhile
                    lost.append(sid)  # type: ignore[arg-type]
                self._resolve(rid, error=r.error)
            else:
                self._resolve(rid, value=r)
        self._finish(batch, failed=False, lost=lost)

    def _finish(self, batch: SequenceBatch, *, failed: bool,
                lost: Collection[SequenceId] = ()) -> None:
        self._inflight.pop(batch.id, None)
        if failed:
            self.engine.fail(batch.id, self._clock())
        else:
            self.engine.complete(batch.id, self._clock(), lost)

    def _replica_died(self, slot: ReplicaSlot, batch: SequenceBatch, error: BaseException) -> None:
        name = slot.client.name
        if slot in self._slots:
            self.replica_deaths += 1
            log.error("replica %s died: %s; its sequences' state is lost", name, error)
            self._drop(slot)
            self._on_replica_died(slot.client)
        self._finish(batch, failed=True)
        self._fail_rows(batch, lambda sid: SequenceLost(
            f"the replica {name} holding sequence {sid!r} died running this request: its "
            "state is gone; start the sequence again with sequence_start"))
        self._schedule_pump()

    def _fail_rows(self, batch: SequenceBatch,
                   error: Callable[[SequenceId], BaseException]) -> None:
        for rid, sid in zip(batch.request_ids, batch.sequence_ids):
            if rid is not None:
                self._resolve(rid, error=error(sid))  # type: ignore[arg-type]

    def _send_releases(self) -> None:
        for slot, ids in self.engine.take_releases().items():
            if slot in self._slots and ids:
                self._spawn(self._release(slot, ids))

    async def _release(self, slot: ReplicaSlot, ids: list[SequenceId]) -> None:
        try:
            await slot.client.release(ids)
            self.releases_sent += len(ids)
        except Exception as e:  # the replica boundary: log it, the state leaks at worst
            self.release_failures += 1
            log.warning("releasing sequences %s on %s failed: %s", ids[:8], slot.client.name, e)

    def _resolve(self, request_id: RequestId, value: Any = None,
                 error: BaseException | None = None) -> None:
        """End one request, exactly once: a late outcome of an ended request is dropped."""
        rec = self._open.pop(request_id, None)
        if rec is None:
            return
        self.engine.batch_stats.record_outcome(error is None, self._clock() - rec.submitted_s)
        kind = outcome_of(error)
        self.outcomes[kind] = self.outcomes.get(kind, 0) + 1
        if not rec.future.done():
            if error is None:
                rec.future.set_result(value)
            else:
                rec.future.set_exception(error)
        if not self._open:
            self._idle.set()
