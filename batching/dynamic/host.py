"""`BatchHost`: the asyncio shell that runs a policy against a pool of replicas.

Placement-agnostic: the embedded `BatchedService` gives it one local worker,
the Ray batching actor gives it a pool of model-replica actors; both see the
same `ReplicaClient` seam (`async run(items) -> (results, compute_s)`). The
host alone reads the clock, arms the one timer at the policy's `deadline()`,
and turns outcomes into futures (the pump, timer and close are `LoopHost`'s,
shared with the sequence and iterative hosts).

Dispatch: a batch goes to the replica with the fewest batches outstanding,
at most `max_inflight` per replica (pipelining: the next batch waits at the
replica while the current one runs). A replica that dies (`ReplicaDied`) is
removed; each of its batches is sent once more, to another replica, where a request
of it is still open and their latest deadline leaves the time a batch takes (else its
requests fail with `WorkerDied`, 503; so do those of a batch whose second replica
dies too); the batch of a replica that hung (`ReplicaHung`, past its time limit) is
not retried: its requests fail with the client's error. A request ends exactly once:
the ledger drops late parts (the answer of a replica given up on, should it come).
Every submit of one event-loop tick is batched together (the pump runs once per
tick), which costs no added wait. `cancel_rows` withdraws some items of a request from
what is still queued (`batching.dynamic.withdraw`); its answer then says which it
carries. Metrics: the `recorder` it is handed gets one value per batch sent and per batch
back (`batching.metrics`); outcomes are counted per request in a dict and sampled with
`snapshot()`.

Deadlines bound every wait: a batch out on a replica (or parked, waiting for one to
run it again) waits for its answer until its requests' latest deadline plus
`ANSWER_GRACE_S`, whatever its replica's connection does (a partition may keep it
silent for minutes); then its open requests fail (`NoAnswerInTime`, 504; parked:
`WorkerDied`, 503) and its replica slot stays taken until the call ends. One heap of
(deadline, batch id) and the host's one timer, never a timer per batch.
"""

from __future__ import annotations

import asyncio
import heapq
import logging
import math
import time
from collections.abc import Callable, Iterable
from typing import Any, Protocol

import numpy as np

from batching.dynamic.batcher import DynamicBatcher
from batching.dynamic.policy import DynamicPolicy
from batching.dynamic.withdraw import RowsWithdrawal
from batching.errors import Cancelled, InvalidRequest, NoAnswerInTime, ServiceClosed, WorkerDied
from batching.ledger import Ledger, Outcome
from batching.loop import (
    Dispatched,
    LoopHost,
    OpenRequest,
    ReplicaDied,
    ReplicaHung,
    ReplicaSlot,
)
from batching.metrics import (
    NULL_RECORDER,
    BatchDone,
    BatchSent,
    HostSnapshot,
    Recorder,
    outcome_of,
)
from batching.tensors import TensorBatch, join_items
from batching.types import Batch, Request, RequestId, Rows

log = logging.getLogger(__name__)
# After a batch's latest deadline, how long its answer may still come before its requests
# fail: an answer due at the deadline is not cut off by a few milliseconds.
ANSWER_GRACE_S = 0.1


class ReplicaClient(Protocol):
    name: str

    async def run(self, items: Any) -> tuple[Any, float]:
        """Run one batch; returns (results, compute seconds). Raises the model's error,
        or ReplicaDied when the replica itself is gone."""
        ...




class BatchHost(RowsWithdrawal, LoopHost[DynamicBatcher]):
    def __init__(self, policy: DynamicPolicy, *, max_inflight: int = 2,
                 clock: Callable[[], float] = time.monotonic,
                 on_replica_died: Callable[[ReplicaClient], None] | None = None,
                 recorder: Recorder = NULL_RECORDER,
                 collate: Callable[[list[Any]], Any] = join_items) -> None:
        super().__init__(clock)
        self.policy = policy
        self.recorder = recorder
        self.outcomes: dict[str, int] = {}  # requests ended, by outcome (batching.metrics)
        self.engine = DynamicBatcher(policy)
        self._collate = collate  # a batch's pieces -> the model's input (batching.tensors)
        self.ledger = Ledger(policy.preserve_ordering)
        self.max_inflight = max_inflight
        self._on_replica_died = on_replica_died or (lambda client: None)
        self._open: dict[RequestId, OpenRequest] = {}
        self._inflight: dict[int, Dispatched] = {}
        self.replica_deaths = 0
        self.retried_batches = 0
        self._parked: list[Dispatched] = []  # batches of a dead replica, waiting for a live one
        self._held = {}  # requests with rows withdrawn (`cancel_rows`)
        self._answer_by: list[tuple[float, int]] = []  # heap: (deadline + grace, batch id)

    # -- replicas -------------------------------------------------------------------------
    _slots: list[ReplicaSlot]

    def add_replica(self, client: ReplicaClient) -> None:
        self._slots.append(ReplicaSlot(client))
        self.engine.replicas = len(self._slots)  # admission's wait is shared among them
        self._unpark()
        self._schedule_pump()

    def seed_latency(self, batches: Iterable[tuple[float, float]]) -> None:
        """Train the latency model with a new replica's warm-up batches, (cost, seconds),
        while the engine has timed none of its own: admission's first predictions then
        come from this model's own batches (first calls included: an overestimate) rather
        than from the time it assumes before any (`admission.COLD_BATCH_S`)."""
        if not self.engine.latency.observed:
            for cost, seconds in batches:
                self.engine.latency.observe(float(cost), float(seconds))

    def remove_replica(self, client: ReplicaClient) -> None:
        """Stop sending to `client`; its outstanding batches finish or fail on their own."""
        self._slots = [s for s in self._slots if s.client is not client]
        self.engine.replicas = max(len(self._slots), 1)

    def outstanding(self, client: ReplicaClient) -> int:
        slot = self._slot_of(client)
        return 0 if slot is None else slot.inflight

    @property
    def queued_work(self) -> int:
        return self.engine.queued_items

    @property
    def open_requests(self) -> int:
        """Requests submitted that have no outcome yet."""
        return len(self._open)

    @property
    def busy(self) -> bool:
        return bool(self.engine.queued_items or self._inflight)

    @property
    def wait_refusals(self) -> int:
        admission = self.engine.admission
        return 0 if admission is None else admission.wait_refusals

    # -- requests -------------------------------------------------------------------------
    def submit(self, request: Request) -> asyncio.Future:
        """Queue `request` and return the future of its outcome; raises QueueFull,
        InvalidRequest or ServiceClosed at once, keeping nothing."""
        if self.closed_reason is not None:
            raise ServiceClosed(self.closed_reason)
        if request.id in self._open:
            raise InvalidRequest(f"request id {request.id!r} is still open: ids must be unique")
        # No await between engine.submit and registering the future, so an outcome
        # can never arrive for an id the host does not know.
        self.engine.submit(request, self._clock())
        fut = self._loop.create_future()
        self.ledger.open(request)
        self._open[request.id] = OpenRequest(fut, request, self._clock(),
                                             self.engine.hard_deadline(request.id))
        self._idle.clear()
        self._schedule_pump()
        return fut

    def cancel(self, request_id: RequestId, why: str = "cancelled by its caller") -> None:
        """End a request with `Cancelled`; what of it is still queued never runs."""
        if request_id in self._open:
            self.engine.cancel(request_id, self._clock())
            self._settle(self.ledger.fail(request_id, Cancelled(f"request {request_id!r} {why}")))

    def abort(self, error: BaseException) -> None:
        """Fail every open request with `error` now."""
        self._parked.clear()
        for rid in list(self._open):
            self.engine.cancel(rid, self._clock())
        self._settle(self.ledger.fail_all(error))
        self._cancel_timer()

    def snapshot(self) -> HostSnapshot:
        """Queue depths, batches in flight and cumulative counts, for a metrics sampler."""
        return HostSnapshot(
            queued=self.engine.queued_by_level(),
            inflight=tuple((s.client.name, s.inflight) for s in self._slots),
            outcomes=dict(self.outcomes), replica_deaths=self.replica_deaths,
            retried_batches=self.retried_batches)

    def stats(self) -> dict[str, Any]:
        a, b = self.engine.latency.coefficients
        return {
            **self.engine.stats.as_dict(),
            "queued_requests": self.engine.queued_requests,
            "queued_items": self.engine.queued_items,
            "inflight_batches": len(self._inflight),
            "open_requests": len(self._open),
            "replicas": len(self._slots),
            "replica_deaths": self.replica_deaths,
            "retried_batches": self.retried_batches,
            # of the requests counted under "fail" (Triton's statistics), those cancelled
            "cancelled": self.outcomes.get("cancelled", 0),
            "latency_model": {"a_ms": a * 1e3, "b_ms_per_cost": b * 1e3,
                              "warm": self.engine.latency.warm},
            **self._admission_stats(),
        }

    def _admission_stats(self) -> dict[str, Any]:
        """The wait bound and what a full batch adds to a wait now (and from where)."""
        admission = self.engine.admission
        if admission is None or admission.max_wait_s is None:
            return {}
        full, each_s, basis = admission.batch_share(self.engine.replicas)
        return {"admission": {"max_queue_wait_s": admission.max_wait_s, "full_batch_cost": full,
                              "batch_share_ms": each_s * 1e3,
                              "batch_spread_ms": admission.rate.spread_s * 1e3,
                              "basis": basis}}

    # -- the pump: the only place batches are formed ---------------------------------------
    def _free_slots(self) -> int:
        return sum(max(self.max_inflight - s.inflight, 0) for s in self._slots)

    def _idle_replicas(self) -> int:
        return sum(s.inflight == 0 for s in self._slots)

    def _pump(self) -> None:
        self._pump_scheduled = False
        now = self._clock()
        if self._answer_by and self._answer_by[0][0] <= now:
            self._end_overdue(now)
        self._unpark()
        while (batch := self.engine.next_batch(now, self._free_slots(),
                                               self._idle_replicas())) is not None:
            self._dispatch(batch, self._pick())
        for failure in self.engine.take_failures():
            self._settle(self.ledger.fail(failure.request_id, failure.error))
        self._arm_timer(self._wake_at(), now)

    def _wake_at(self) -> float | None:
        """The engine's next deadline, or a batch's answer-by time if sooner."""
        at = self.engine.deadline()
        heap, inflight = self._answer_by, self._inflight
        while heap and heap[0][1] not in inflight:  # answered: no wake-up for it
            heapq.heappop(heap)
        if heap and (at is None or heap[0][0] < at):
            return heap[0][0]
        return at

    def _end_overdue(self, now: float) -> None:
        """Fail the open requests of each batch whose answer-by time passed (see the note)."""
        heap = self._answer_by
        while heap and heap[0][0] <= now:
            sent = self._inflight.get(heapq.heappop(heap)[1])
            if sent is None:
                continue
            batch = sent.batch
            if sent.parked:
                self._parked.remove(sent)
                self._finish(batch, None)
                error: BaseException = WorkerDied(
                    "the replica running this request's batch was lost, and no replica was "
                    "free to run it again before its deadline: retry")
            else:  # its call goes on, holding its slot; an answer, if any, is dropped
                log.warning("no answer for batch %d (requests %s) by its deadline",
                            batch.id, batch.ids[:8])
                error = NoAnswerInTime(
                    f"no answer came for this request's batch by its deadline (+"
                    f"{ANSWER_GRACE_S:g} s): the replica running it is slow, hung or cut off")
            self._settle(self.ledger.fail_batch(batch, error))

    def _unpark(self) -> None:
        # Parked batches are older than anything queued: they take free slots first, on a
        # new replica or on a live one that was full when their replica died.
        while self._parked and self._free_slots():
            sent = self._parked.pop(0)
            sent.parked = False
            if self._may_resend(sent, "its replica was lost"):
                self._send(sent, self._pick())

    def _pick(self) -> ReplicaSlot:
        return min((s for s in self._slots if s.inflight < self.max_inflight),
                   key=lambda s: s.inflight)

    def _dispatch(self, batch: Batch, slot: ReplicaSlot) -> None:
        now, open_, stats = batch.created_s, self._open, self.engine.stats
        default = self.policy.default_level
        waits, levels = [], []
        latest = -math.inf  # the batch's latest deadline: its wait for an answer ends then
        for p in batch.parts:
            rec = open_[p.request_id]
            if rec.deadline_s > latest:
                latest = rec.deadline_s
            if p.start == 0:  # a request counts its wait once, in the batch it starts in
                wait, n = now - rec.submitted_s, rec.request.requests
                stats.record_queue(wait, n)
                waits.extend((wait,) * n)
                levels.extend((rec.request.priority or default,) * n)
        self.recorder.batch_sent(BatchSent(batch.num_items, batch.cost, batch.reason.value,
                                           tuple(waits), tuple(levels)))
        # The inputs are taken now, while every member is open: a member cancelled before
        # the batch is sent (or retried) must not take its batch-mates down with it.
        sent = self._inflight[batch.id] = Dispatched(batch, self._inputs(batch), latest)
        if latest != math.inf:
            heapq.heappush(self._answer_by, (latest + ANSWER_GRACE_S, batch.id))
        self._send(sent, slot)

    def _send(self, sent: Dispatched, slot: ReplicaSlot) -> None:
        slot.inflight += 1
        self._spawn(self._run(sent, slot))

    async def _run(self, sent: Dispatched, slot: ReplicaSlot) -> None:
        batch = sent.batch
        try:
            results, compute_s = await slot.client.run(sent.inputs)
        except ReplicaDied as e:
            slot.inflight -= 1
            self._replica_died(slot, sent, e)
            return
        except BaseException as e:  # the model's own error: this batch's requests only
            slot.inflight -= 1
            self._finish(batch, None)
            self.recorder.batch_done(BatchDone(batch.num_items,
                                               self._clock() - batch.created_s, None))
            self._settle(self.ledger.fail_batch(batch, e))
            self._schedule_pump()
            if isinstance(e, asyncio.CancelledError):
                raise
            return
        slot.inflight -= 1
        self._finish(batch, compute_s)
        self.engine.stats.record_compute(batch.num_items, compute_s)
        self.recorder.batch_done(BatchDone(batch.num_items, self._clock() - batch.created_s,
                                           compute_s))
        # The next batch first, then the answers: its task is then scheduled ahead of
        # the callbacks of this batch's futures (each writes a response), so the
        # replica starts it before those run, not after all of them.
        self._pump()
        self._settle(self.ledger.deliver(batch, results))

    def _finish(self, batch: Batch, compute_s: float | None) -> None:
        """`compute_s` None: the batch failed, and must not train the latency model."""
        self._inflight.pop(batch.id, None)
        self.engine.complete(batch.id, self._clock(), compute_s, failed=compute_s is None)

    def _replica_died(self, slot: ReplicaSlot, sent: Dispatched, error: BaseException) -> None:
        batch = sent.batch
        if any(s is slot for s in self._slots):
            self.replica_deaths += 1
            log.error("replica %s died: %s", slot.client.name, error)
            self.remove_replica(slot.client)
            self._on_replica_died(slot.client)
        if sent.retried or isinstance(error, ReplicaHung):
            why = error.error if isinstance(error, ReplicaHung) else WorkerDied(
                f"two replicas died running this request (last: {error}); not retried again")
            self._finish(batch, None)
            self._settle(self.ledger.fail_batch(batch, why))
            self._schedule_pump()
            return
        if not self._may_resend(sent, f"the replica running this request's batch was lost "
                                      f"({error})"):
            self._schedule_pump()
            return
        sent.retried = True
        self.retried_batches += 1
        live = [s for s in self._slots if s.inflight < self.max_inflight]
        if live:
            target = min(live, key=lambda s: s.inflight)
            log.warning("retrying batch %d (requests %s) on %s", batch.id, batch.ids,
                        target.client.name)
            self._send(sent, target)
        else:
            sent.parked = True
            self._parked.append(sent)  # _unpark sends it when a slot frees up

    def _may_resend(self, sent: Dispatched, why: str) -> bool:
        """Whether the batch of a lost replica may run again: some request of it is still
        open, and their latest deadline leaves the time a batch takes. If not, it ends
        here, its open requests with `WorkerDied` (503: nothing of it is known to have
        run, a retry is safe for a stateless model)."""
        batch = sent.batch
        if not any(p.request_id in self.ledger for p in batch.parts):
            self._finish(batch, None)  # every request ended meanwhile (deadline, cancel)
            return False
        latency = self.engine.latency
        need_s = latency.predict(batch.cost) if latency.observed else 0.0
        if sent.deadline_s - self._clock() > need_s:
            return True
        self._finish(batch, None)
        self._settle(self.ledger.fail_batch(batch, WorkerDied(
            f"{why}, too near its deadline to run it again elsewhere: retry")))
        return False

    def _inputs(self, batch: Batch) -> Any:
        """The batch's items as one contiguous array (or TensorBatch) when they are
        arrays, padded or listed as the model's ragged tensors declare, else a list.

        One array pickles far faster than a list of row arrays (`benchmarks.serve.
        bundle_path`), and the model would stack them anyway.
        """
        open_ = self._open
        pieces = []
        for p in batch.parts:
            r = open_[p.request_id].request
            pieces.append(r.items[0:1] if r.single else _slice(r.items, p.start, p.stop))
        return self._collate(pieces)

    def _settle(self, outcomes: list[Outcome]) -> None:
        open_, counts = self._open, self.outcomes
        now, stats = self._clock(), self.engine.stats
        for o in outcomes:
            rec = open_.pop(o.request_id, None)
            held = self._held.pop(o.request_id, None) if self._held else None
            if rec is None:
                continue
            n = rec.request.requests
            stats.record_outcome(o.error is None, now - rec.submitted_s, n)
            kind = outcome_of(o.error)
            counts[kind] = counts.get(kind, 0) + n
            if o.error is not None:  # a split request that failed: its queued rest never runs
                self.engine.cancel(o.request_id, now)
            if rec.future.done():
                continue
            if o.error is None:
                rec.future.set_result(o.value if held is None else Rows(o.value, held.rows))
            else:
                rec.future.set_exception(o.error)
        if not open_:
            self._idle.set()


def _slice(items: Any, start: int, stop: int) -> Any:
    if start == 0 and stop == len(items):
        return items if isinstance(items, (np.ndarray, TensorBatch)) else list(items)
    return items[start:stop]
