"""Dynamic batching as a pure state machine: `submit`, `next_batch`, `deadline`, `complete`.

The host owns the clock: every call is handed `now`, and `deadline()` says when
the host must call `next_batch` again if nothing else happens. The batcher
never sleeps, spawns or awaits, so a unit test is one line per instant.

Order of service: priority level 1 first; within a level, earliest deadline
first (no deadline sorts last, FIFO), then the requests delayed by their
level's `timeout_action=delay`. When to send, checked in this order:
  drain      the host is closing: send what is queued, no waiting;
  full       `max_batch_size` items or `max_batch_cost` queued;
  idle       `idle_dispatch` and no batch in flight: no replica is busy, so a fuller
             batch is not worth a wait (Triton's semantics when the flag is off);
  preferred  the largest preferred size is queued;
  deadline   a queued request's deadline leaves just the predicted batch latency
             (with a cold latency model: it comes before the delay would run out);
  delay      the oldest request waited `max_queue_delay_s` (or, with
             `adaptive_delay`, waiting for one more request would miss its target);
             with `fill_while_busy` and every replica running a batch, not before the
             first running batch is predicted to end (less `busy_lead_s`).
Expired requests are failed (or delayed) before anything is formed, so nothing
expired reaches a replica. With `max_queue_wait_s` (`admission.py`), a request that
would wait longer (or past its deadline) is refused at submit with `Overloaded`; with
`deadline_admission`, one that cannot finish by its deadline at the measured service
rate is refused at submit, and a queued one that no longer can is shed before it runs.
A request that does not fit is split: the batch takes what fits and the rest
stays at the head of its queue. With `group_by_length` a batch starts with the
same request and takes the queued requests nearest to it in length as its
batch-mates (`grouping.by_length`).
"""

from __future__ import annotations

import itertools
import math
from collections import OrderedDict
from collections.abc import Iterator, Sequence

from batching.dynamic.admission import Admission
from batching.dynamic.grouping import by_length
from batching.dynamic.policy import DynamicPolicy, TimeoutAction
from batching.dynamic.queues import Entry, LevelQueue, cumulative_costs
from batching.dynamic.withdraw import Cut, withdraw
from batching.errors import QUEUE_FULL, DeadlineExceeded, InvalidRequest, QueueFull
from batching.latency import LatencyModel
from batching.metrics import LevelDepth
from batching.stats import BatchStats
from batching.types import Batch, Failure, FlushReason, Part, Request, RequestId

_EWMA = 0.1  # weight of the newest sample in the arrival-rate estimates


class DynamicBatcher:
    """Gathers requests of a stateless model into batches under a `DynamicPolicy`.

    >>> q = DynamicBatcher(DynamicPolicy(max_batch_size=4, max_queue_delay_s=0.010))
    >>> q.submit(Request("a", (1,), single=True), now=0.0)
    >>> q.next_batch(now=0.009, free_replicas=1) is None
    True
    >>> q.next_batch(now=0.010, free_replicas=1).ids
    ['a']
    """

    def __init__(self, policy: DynamicPolicy, latency: LatencyModel | None = None) -> None:
        self.policy = policy
        self.latency = latency or LatencyModel()
        self.stats = BatchStats()
        self._levels = [LevelQueue() for _ in range(policy.priority_levels)]
        self._queued: OrderedDict[RequestId, Entry] = OrderedDict()  # arrival order
        self._items = 0
        self._cost = 0.0
        self._inflight: dict[int, Batch] = {}
        self._inflight_cost = 0.0
        self._failures: list[Failure] = []
        self._seq = itertools.count()
        self._batch_ids = itertools.count()
        self._draining = False
        self._blocked = False  # the last next_batch call had no free replica
        self._hold_until_s = -math.inf  # fill_while_busy: no DELAY send before this
        self._idle_replicas: int | None = None  # as the last next_batch call was told
        self._ends: dict[int, float] = {}  # fill_while_busy: batch id -> predicted end
        self._max_cost = policy.max_batch_cost or math.inf
        # Per-level settings read on every submit, looked up once here.
        self._default_level = policy.default_level
        self._limits = [(q.max_queue_size, q.default_timeout_s or math.inf,
                         q.allow_timeout_override)
                        for q in map(policy.queue_policy, range(1, policy.priority_levels + 1))]
        self._admission = Admission(
            [policy.queue_policy(i).timeout_action is TimeoutAction.DELAY
             for i in range(1, policy.priority_levels + 1)],
            self.latency, max_wait_s=policy.max_queue_wait_s,
            deadlines=policy.deadline_admission,
            full_cost=min(float(policy.max_batch_size), self._max_cost),
        ) if policy.deadline_admission or policy.max_queue_wait_s is not None else None
        self.replicas = 1  # replicas serving this engine (the host keeps it current)
        self._shed_due = False  # the service rate or the work in flight changed
        self._last_arrival_s: float | None = None
        self._interarrival_s = math.inf
        self._request_cost = 1.0
        self._length_fn = policy.length_fn if policy.group_by_length else None
        if policy.group_by_length and self._length_fn is None:
            raise ValueError("group_by_length=True needs a length_fn (the length of a "
                             "request's items), or a model that declares a ragged input")

    # -- state the host may read --------------------------------------------------------
    @property
    def queued_requests(self) -> int:
        return len(self._queued)

    @property
    def queued_items(self) -> int:
        return self._items

    @property
    def inflight_batches(self) -> int:
        return len(self._inflight)

    @property
    def admission(self) -> Admission | None:
        """The admission checks (wait bound, deadlines); None when both are off."""
        return self._admission

    def queued_by_level(self) -> tuple[LevelDepth, ...]:
        """Requests and items waiting at each priority level (1 first)."""
        return tuple(LevelDepth(i, q.count, q.items) for i, q in enumerate(self._levels, 1))

    def hard_deadline(self, request_id: RequestId) -> float:
        """When queued request `request_id` must have ended: its deadline, or math.inf
        (none, or its level's `timeout_action=delay` runs it late rather than fail it)."""
        entry = self._queued.get(request_id)
        if entry is None or self.policy.queue_policy(entry.level).timeout_action \
                is TimeoutAction.DELAY:
            return math.inf
        return entry.deadline_s

    def take_failures(self) -> list[Failure]:
        """Requests the batcher ended without running them since the last call."""
        out, self._failures = self._failures, []
        return out

    # -- inputs -------------------------------------------------------------------------
    def submit(self, request: Request, now: float) -> None:
        """Queue `request`; raises `InvalidRequest` or `QueueFull` and then keeps nothing."""
        level = self._level_of(request)
        if request.num_items < 1:
            raise InvalidRequest(f"request {request.id!r} has no items: send at least one")
        if request.id in self._queued:
            raise InvalidRequest(f"request id {request.id!r} is already queued: ids must be unique")
        queue = self._levels[level - 1]
        max_size = self._limits[level - 1][0]
        if max_size is not None and queue.count >= max_size:
            raise QueueFull(
                f"{QUEUE_FULL}: priority level {level} already holds {queue.count} requests "
                f"(max_queue_size={max_size}): retry later"
            )
        cum_cost = cumulative_costs(request, self.policy.cost_fn, self._max_cost)
        entry = Entry(request, level, now, now + self._timeout_of(request, level),
                      next(self._seq), cum_cost)
        cost = float(request.num_items) if cum_cost is None else cum_cost[-1]
        if self._admission is not None:  # Overloaded: it would wait or end too late
            self._admission.check(entry, self._levels, self._inflight_cost, cost, now,
                                  self.replicas)
        if self._length_fn is not None:
            entry.length = float(self._length_fn(request.items))
        queue.push(entry)
        queue.items += request.num_items
        queue.cost += cost
        self._queued[request.id] = entry
        self._items += request.num_items
        self._cost += cost
        self._note_arrival(now, cost)

    def cancel(self, request_id: RequestId, now: float) -> bool:
        """Withdraw what of a request is still queued; True if anything was withdrawn."""
        entry = self._queued.get(request_id)
        if entry is not None:
            self._remove(entry)
        return entry is not None

    def cancel_rows(self, request_id: RequestId, rows: Sequence[int], now: float) -> Cut | None:
        """Withdraw the items `rows` (indices into the request as queued now) not yet in a
        batch (`batching.dynamic.withdraw`); None if none was (or it is not queued)."""
        entry = self._queued.get(request_id)
        cut = None if entry is None else withdraw(entry, self._levels[entry.level - 1], rows,
                                                  self._length_fn)
        if cut is None:
            return None
        self._items -= cut.items
        self._cost -= cut.cost
        if entry.removed:  # none of it waits now
            del self._queued[request_id]
        return cut

    def complete(self, batch_id: int, now: float, compute_s: float | None = None,
                 *, failed: bool = False) -> Batch:
        """Record that `batch_id` finished; its latency trains the latency model
        (`compute_s` if the replica measured it, else the time since dispatch),
        unless it `failed`: a crash says nothing about how long a batch takes."""
        batch = self._inflight.pop(batch_id, None)
        if batch is None:
            raise KeyError(f"batch {batch_id} is not in flight (completed twice?)")
        self._ends.pop(batch_id, None)
        self._inflight_cost -= batch.cost
        if not self._inflight:
            self._inflight_cost = 0.0  # no float drift left over
        if self._admission is not None:
            # busy: work in flight, or a full batch queued (the replicas' next batch
            # waits on the host, not on arrivals: that time is the service's too)
            rate = self._admission.rate
            busy = bool(self._inflight) or self._cost >= self._admission.full_cost - 1e-9
            if failed:
                rate.failed(busy, now)
            else:
                full = (batch.num_items >= self.policy.max_batch_size
                        or batch.cost >= self._max_cost - 1e-9)
                rate.completed(now, batch.cost, full, busy, max(self.replicas, 1))
            self._shed_due = True
        if not failed:
            latency_s = compute_s if compute_s is not None else now - batch.created_s
            self.latency.observe(batch.cost, latency_s)
        return batch

    def drain(self) -> None:
        """From now on send whatever is queued without waiting (the host is closing)."""
        self._draining = True

    # -- decisions ----------------------------------------------------------------------
    def next_batch(self, now: float, free_replicas: int,
                   idle_replicas: int | None = None) -> Batch | None:
        """The batch to run now, or None: nothing is due or no replica is free.
        `idle_replicas`: replicas running no batch (free slots may be pipeline slots of
        busy replicas); None: not known, taken as some (`fill_while_busy` holds nothing)."""
        self._idle_replicas = idle_replicas
        self._hold_until_s = self._busy_until_s(idle_replicas)
        self._expire(now)
        if self._admission is not None and (self._shed_due or free_replicas > 0):
            self._shed(now)
        self._blocked = free_replicas <= 0
        if self._blocked or not self._queued:
            return None
        due = self._due(now)
        if due is None:
            return None
        reason, target_items = due
        return self._form(reason, target_items, now)

    def deadline(self) -> float | None:
        """When to call `next_batch` again if nothing is submitted or completed before."""
        if not self._queued:
            return None
        times = [min(q.earliest_deadline() for q in self._levels)]
        if not self._blocked:
            if self.policy.idle_dispatch and not self._inflight:  # due now
                times.append(next(iter(self._queued.values())).arrival_s)
            times.append(max(self._delay_send_s(), self._hold_until_s))
            times.append(self._deadline_send_s())
        t = min(times)
        if t == math.inf:
            return None
        # The adaptive slack is infinite before a second arrival, which makes the send time
        # -inf: report "due now" as the oldest arrival, a time a host can sleep until.
        return max(t, next(iter(self._queued.values())).arrival_s)

    # -- phases of next_batch ------------------------------------------------------------
    def _expire(self, now: float) -> None:
        for queue in self._levels:
            for entry in queue.pop_expired(now):
                action = self.policy.queue_policy(entry.level).timeout_action
                if action is TimeoutAction.DELAY:
                    entry.delayed = True
                    queue.delayed.append(entry)
                    continue
                self._remove(entry)
                waited = now - entry.arrival_s
                self._failures.append(Failure(entry.request.id, DeadlineExceeded(
                    f"request {entry.request.id!r} waited {waited * 1e3:.1f} ms and passed its "
                    "deadline before it could run; raise its timeout or add replicas"
                )))

    def _shed(self, now: float) -> None:
        self._shed_due = False
        for entry, error in self._admission.shed(self._levels, self._inflight_cost, now,
                                                 self.replicas):
            self._remove(entry)
            self._failures.append(Failure(entry.request.id, error))

    def _due(self, now: float) -> tuple[FlushReason, int] | None:
        p = self.policy
        if self._draining:
            return FlushReason.DRAIN, p.max_batch_size
        if self._items >= p.max_batch_size or self._cost >= self._max_cost:
            return FlushReason.FULL, p.max_batch_size
        if p.idle_dispatch and not self._inflight:
            return FlushReason.IDLE, p.max_batch_size
        largest = p.largest_preferred
        if largest is not None and self._items >= largest:
            return FlushReason.PREFERRED, largest
        if self._deadline_send_s() <= now:
            return FlushReason.DEADLINE, p.max_batch_size
        if max(self._delay_send_s(), self._hold_until_s) <= now:
            fitting = [s for s in p.preferred_batch_sizes if s <= self._items]
            return FlushReason.DELAY, (fitting[-1] if fitting else p.max_batch_size)
        return None

    def _form(self, reason: FlushReason, target_items: int, now: float) -> Batch:
        parts: list[Part] = []
        room_items, room_cost, batch_cost = target_items, self._max_cost, 0.0
        for queue in self._levels:
            for entry in self._service_order(queue):
                if room_items <= 0:
                    break
                take = entry.fit(room_items, room_cost)
                if take == 0:
                    if self._length_fn is not None:
                        continue  # grouped: a nearer-length request may still fit
                    break  # the next item does not fit the cost left; never skip ahead of it
                start = entry.offset
                cost = entry.cost(start, start + take)
                parts.append(Part(entry.request.id, start, start + take))
                entry.offset += take
                room_items -= take
                room_cost -= cost
                queue.items -= take
                queue.cost -= cost
                batch_cost += cost
                self._items -= take
                self._cost -= cost
                if entry.remaining_items:
                    break  # out of room: the rest of this request waits in its place
                queue.count -= 1
                entry.removed = True  # the heap drops it lazily
                del self._queued[entry.request.id]
            if queue.head() is not None:
                break  # this level still has requests, so the batch is full
        batch = Batch(
            id=next(self._batch_ids),
            parts=tuple(parts),
            num_items=target_items - room_items,
            cost=batch_cost,
            reason=reason,
            created_s=now,
        )
        if self._admission is not None:
            self._admission.rate.sent(now, idle=not self._inflight)
        if self.policy.fill_while_busy:
            self._ends[batch.id] = self._predicted_end_s(batch_cost, now)
        self._inflight[batch.id] = batch
        self._inflight_cost += batch_cost
        self.stats.record(batch)
        return batch

    def _service_order(self, queue: LevelQueue) -> Iterator[Entry]:
        """The entries a batch takes from `queue`, in order: the head, again and again,
        or grouped by length (the head first, then its nearest lengths)."""
        if self._length_fn is not None:
            yield from by_length(queue, self.policy.length_window)
            return
        while (entry := queue.head()) is not None:
            yield entry

    # -- when to send -------------------------------------------------------------------
    def _batch_cost_now(self) -> float:
        share = min(1.0, self.policy.max_batch_size / self._items) if self._items else 1.0
        return min(self._cost * share, self._max_cost)

    def _adaptive(self) -> bool:
        return self.policy.adaptive_delay and self.latency.warm

    def _wait_slack_s(self) -> float:
        """Time a batch needs after it is sent: its predicted latency (plus, adaptively,
        the expected wait for one more request, since waiting is only worth that)."""
        cost = self._batch_cost_now()
        if self._adaptive():
            return self.latency.predict(cost + self._request_cost) + self._interarrival_s
        return self.latency.predict(cost)

    def _busy_until_s(self, idle_replicas: int | None) -> float:
        """With `fill_while_busy` and no replica idle: when the first batch in flight is
        predicted to end, less the lead; else -inf (nothing to hold for)."""
        p = self.policy
        if (not p.fill_while_busy or idle_replicas is None or idle_replicas > 0
                or not self._ends or not self.latency.warm):
            return -math.inf
        return min(self._ends.values()) - p.busy_lead_s

    def _predicted_end_s(self, cost: float, now: float) -> float:
        """When a batch formed now should end: it starts now on an idle replica, else
        (a pipeline slot) when the first batch in flight ends. With several replicas that
        may be another replica's batch, which ends sooner: the estimate errs toward
        sending the next batch early, never toward leaving a replica idle."""
        start = now
        if self._idle_replicas == 0 and self._ends:
            start = max(now, min(self._ends.values()))
        return start + self.latency.predict(cost)

    def _delay_send_s(self) -> float:
        oldest = next(iter(self._queued.values()))
        if self._adaptive():
            return oldest.arrival_s + self.policy.target_latency_s - self._wait_slack_s()
        return oldest.arrival_s + self.policy.max_queue_delay_s

    def _deadline_send_s(self) -> float:
        earliest = min(q.earliest_deadline() for q in self._levels)
        if earliest == math.inf:
            return math.inf
        if not self.latency.warm:
            # No latency estimate yet. If the delay outlasts a deadline, waiting misses it
            # for sure: send now (a model that never runs would also never warm up).
            return -math.inf if earliest <= self._delay_send_s() else math.inf
        return earliest - self._wait_slack_s()

    # -- bookkeeping ----------------------------------------------------------------------
    def _remove(self, entry: Entry) -> None:
        entry.removed = True
        queue = self._levels[entry.level - 1]
        queue.count -= 1
        queue.items -= entry.remaining_items
        queue.cost -= entry.remaining_cost
        self._items -= entry.remaining_items
        self._cost -= entry.remaining_cost
        del self._queued[entry.request.id]

    def _note_arrival(self, now: float, cost: float) -> None:
        if self._last_arrival_s is not None:
            gap = now - self._last_arrival_s
            ia = self._interarrival_s
            self._interarrival_s = gap if ia == math.inf else ia + _EWMA * (gap - ia)
        self._last_arrival_s = now
        self._request_cost += _EWMA * (cost - self._request_cost)

    def _level_of(self, request: Request) -> int:
        prio = request.priority
        if not prio:
            return self._default_level
        levels = self.policy.priority_levels
        if not 1 <= prio <= levels:
            raise InvalidRequest(
                f"priority={prio} is out of range: this model has priority_levels={levels} "
                f"(1 = highest), so send 1..{levels} or leave it out"
            )
        return prio

    def _timeout_of(self, request: Request, level: int) -> float:
        _, timeout, override = self._limits[level - 1]
        if request.timeout_s is not None:
            if request.timeout_s <= 0:
                raise InvalidRequest(f"timeout_s={request.timeout_s} must be > 0 seconds")
            if override:
                timeout = min(timeout, request.timeout_s)
        return timeout
