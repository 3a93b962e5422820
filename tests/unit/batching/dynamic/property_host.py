"""The fake host behind the dynamic batcher's property tests, and its hypothesis strategies.

`Host` drives DynamicBatcher + Ledger together against an independent model of what is
queued, and checks every promise at each step and at the end (see test_properties.py).
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass

import numpy as np
from hypothesis import event
from hypothesis import strategies as st

from batching import (
    Batch,
    BatchSizeMismatch,
    Cancelled,
    DeadlineExceeded,
    DynamicBatcher,
    DynamicPolicy,
    FlushReason,
    InvalidRequest,
    ItemFailed,
    LatencyModel,
    Ledger,
    Outcome,
    QueueFull,
    QueuePolicy,
    Request,
    TimeoutAction,
)

TIMES = [0.0, 0.0, 0.0, 0.25, 0.25, 0.5, 1.0, 2.0]  # binary fractions: deadlines compare exactly


def item_cost(v: int) -> float:
    return float(v % 10)


# -- scenarios -----------------------------------------------------------------------------
queue_policies = st.builds(
    QueuePolicy,
    max_queue_size=st.none() | st.integers(1, 4),
    default_timeout_s=st.sampled_from([None, None, 1.0, 2.0, 8.0]),
    timeout_action=st.sampled_from(TimeoutAction),
    allow_timeout_override=st.booleans(),
)


@st.composite
def policies(draw) -> tuple[DynamicPolicy, str]:
    max_bs = draw(st.integers(1, 8))
    levels = draw(st.integers(1, 3))
    mode = draw(st.sampled_from(["cold", "cold", "warm", "adaptive"]))
    use_cost = draw(st.booleans())
    policy = DynamicPolicy(
        max_batch_size=max_bs,
        max_queue_delay_s=draw(st.sampled_from([0.0, 0.5, 1.0, 3.0])),
        idle_dispatch=draw(st.booleans()),
        # One replica, as far as fill_while_busy is told (`Machine.idle_replicas`).
        fill_while_busy=draw(st.booleans()),
        busy_lead_s=draw(st.sampled_from([0.0, 0.125])),
        preferred_batch_sizes=tuple(draw(st.lists(st.integers(1, max_bs), max_size=3))),
        max_batch_cost=draw(st.none() | st.sampled_from([3.0, 5.0, 12.0])),
        cost_fn=item_cost if use_cost else None,
        priority_levels=levels,
        default_priority_level=draw(st.none() | st.integers(1, levels)),
        default_queue_policy=draw(queue_policies),
        priority_queue_policy=draw(st.dictionaries(st.integers(1, levels), queue_policies,
                                                   max_size=levels)),
        preserve_ordering=draw(st.booleans()),
        # The model below knows plain queue deadlines; deadline admission (refusing and
        # shedding by the measured rate) has its own tests: test_admission.py.
        deadline_admission=False,
        adaptive_delay=mode == "adaptive",
        target_latency_s=draw(st.sampled_from([1.0, 2.5])) if mode == "adaptive" else None,
    )
    return policy, mode


@st.composite
def submits(draw):
    n = draw(st.integers(1, 6))
    costs = draw(st.lists(st.integers(0, 3), min_size=n, max_size=n))
    return ("submit", draw(st.sampled_from(TIMES)), costs,
            draw(st.sampled_from([None, 0, 1, 2, 3] * 3 + [-1])),  # see Host.submit
            draw(st.sampled_from([None, None, 0.25, 0.5, 1.0, 2.0, 4.0, 8.0])),
            draw(st.booleans()))


ops = st.one_of(
    submits(),
    submits(),
    st.tuples(st.just("tick"), st.sampled_from(TIMES), st.sampled_from([0, 0, 1, 1, 2, 3])),
    st.tuples(st.just("tick"), st.sampled_from(TIMES), st.sampled_from([0, 0, 1, 1, 2, 3])),
    st.tuples(st.just("complete"), st.sampled_from(TIMES), st.integers(0, 50),
              st.sampled_from(["ok", "ok", "ok", "item_failed", "mismatch"]), st.integers(0, 50)),
    st.tuples(st.just("cancel"), st.sampled_from(TIMES), st.integers(0, 50)),
)


# -- the fake host and the independent model -----------------------------------------------
@dataclass
class Info:
    request: Request
    level: int
    deadline_s: float
    seq: int
    arrival_s: float
    reject: bool
    cum: list[float]
    dispatched: int = 0
    gone: bool = False  # cancelled or failed by the batcher

    @property
    def queued(self) -> bool:
        return not self.gone and self.dispatched < self.request.num_items

    @property
    def key(self) -> tuple[float, int]:
        return (self.deadline_s, self.seq)

    def remaining_cost(self) -> float:
        return self.cum[-1] - self.cum[self.dispatched]


class Host:
    def __init__(self, policy: DynamicPolicy, mode: str, array_results: bool) -> None:
        self.p, self.mode, self.arrays = policy, mode, array_results
        latency = LatencyModel(min_samples=2 if mode != "cold" else 10**9)
        self.q = DynamicBatcher(policy, latency=latency)
        self.led = Ledger(preserve_ordering=policy.preserve_ordering)
        self.now = 0.0
        self.info: dict[int, Info] = {}
        self.inflight: list[Batch] = []
        self.opened: list[int] = []
        self.released: list[int] = []
        self.outcomes: dict[int, list[Outcome]] = defaultdict(list)
        self.expected_error: dict[int, object] = {}
        self.draining = False
        self.idle: tuple[str, float | None] | None = None
        self.seq = 0

    # -- model helpers ---------------------------------------------------------------------
    def queued(self) -> list[Info]:
        return [i for i in self.info.values() if i.queued]

    def end_with_error(self, rid: int, error) -> None:
        if rid in self.led:
            self.expected_error.setdefault(rid, error)
        self.release(self.led.fail(rid, error))

    def release(self, outcomes: list[Outcome]) -> None:
        for o in outcomes:
            self.outcomes[o.request_id].append(o)
            self.released.append(o.request_id)
        if self.p.preserve_ordering:
            assert self.released == self.opened[: len(self.released)]

    def check_counts(self) -> None:
        queued = self.queued()
        assert self.q.queued_requests == len(queued)
        assert self.q.queued_items == sum(i.request.num_items - i.dispatched for i in queued)
        assert self.q.inflight_batches == len(self.inflight)

    # -- operations ------------------------------------------------------------------------
    def submit(self, costs: list[int], priority, timeout_s, single: bool) -> None:
        self.idle = None
        if priority is not None and priority > 0:  # a level that exists; -1 never does
            priority = (priority - 1) % self.p.priority_levels + 1
        rid = len(self.opened)
        items = tuple(rid * 1000 + k * 10 + c for k, c in enumerate(costs))
        r = Request(rid, items, single=single and len(items) == 1, priority=priority,
                    timeout_s=timeout_s)
        self.led.open(r)
        self.opened.append(rid)
        p = self.p
        level = priority if priority else p.default_level
        expect = None
        if not 1 <= level <= p.priority_levels:
            expect = InvalidRequest
        else:
            qp = p.queue_policy(level)
            count = sum(1 for i in self.queued() if i.level == level)
            if qp.max_queue_size is not None and count >= qp.max_queue_size:
                expect = QueueFull
        try:
            self.q.submit(r, now=self.now)
        except (InvalidRequest, QueueFull) as e:
            assert type(e) is expect, (e, expect)
            event(f"submit {type(e).__name__}")
            self.end_with_error(rid, e)
            return
        assert expect is None
        event("submit ok")
        timeout = qp.default_timeout_s or math.inf
        if timeout_s is not None and qp.allow_timeout_override:
            timeout = min(timeout, timeout_s)
        cum = [0.0]
        for v in items:
            cum.append(cum[-1] + (item_cost(v) if p.cost_fn else 1.0))
        self.info[rid] = Info(r, level, self.now + timeout, self.seq, self.now,
                              qp.timeout_action is TimeoutAction.REJECT, cum)
        self.seq += 1

    def cancel(self, idx: int) -> None:
        if not self.opened:
            return
        self.idle = None
        rid = self.opened[idx % len(self.opened)]
        info = self.info.get(rid)
        was_queued = info is not None and info.queued
        assert self.q.cancel(rid, now=self.now) is was_queued
        if info is not None:
            info.gone = info.gone or was_queued
        self.end_with_error(rid, Cancelled(f"request {rid} cancelled"))

    def complete(self, idx: int, how: str, which: int) -> None:
        if not self.inflight:
            return
        self.idle = None
        b = self.inflight.pop(idx % len(self.inflight))
        assert self.q.complete(b.id, now=self.now, compute_s=0.25 + 0.125 * b.cost) is b
        results: list = []
        owners: list[int] = []
        for part in b.parts:
            items = self.info[part.request_id].request.items[part.start : part.stop]
            results.extend(2 * v + 1 for v in items)
            owners.extend([part.request_id] * part.num_items)
        if how == "item_failed":
            k = which % len(results)
            error = ValueError(f"item {k} of batch {b.id}")
            results[k] = ItemFailed(error)
            if owners[k] in self.led:
                self.expected_error.setdefault(owners[k], error)
        elif how == "mismatch":
            results = results[:-1] if which % 2 else [*results, 0]
            for rid in set(owners):
                if rid in self.led:
                    self.expected_error.setdefault(rid, BatchSizeMismatch)
        if self.arrays:
            results = np.array(results, dtype=object if how == "item_failed" else np.int64)
        self.release(self.led.deliver(b, results))

    def tick(self, free: int) -> None:
        if self.idle is not None:
            kind, until = self.idle
            # deadline() promised that nothing happens before `until` without new events
            if (until is None or self.now < until) and (kind == "none-due" or free == 0):
                assert self.q.next_batch(now=self.now, free_replicas=free,
                                         idle_replicas=self.idle_replicas()) is None
                assert self.q.take_failures() == []
        while True:
            b = self.q.next_batch(now=self.now, free_replicas=free,
                                  idle_replicas=self.idle_replicas())
            self.take_failures()
            if b is None:
                if free > 0:
                    self.check_not_due()
                    if self.q._hold_until_s > self.now:
                        event("fill_while_busy held a due batch")
                break
            assert free > 0
            self.take_batch(b)
            free -= 1
        self.check_counts()
        self.idle = ("none-due" if free > 0 else "blocked", self.q.deadline())
        until = self.idle[1]
        if until is not None and self.idle[0] == "none-due":
            assert until > self.now  # nothing was due, so the next look lies ahead

    def idle_replicas(self) -> int:
        """One replica: busy while any batch is in flight (what the host tells the engine;
        it changes only with a batch sent or completed, events of their own)."""
        return 0 if self.inflight else 1

    def take_failures(self) -> None:
        failures = self.q.take_failures()
        assert len({f.request_id for f in failures}) == len(failures)
        for f in failures:
            info = self.info[f.request_id]
            assert info.queued and info.reject and info.deadline_s <= self.now
            assert isinstance(f.error, DeadlineExceeded)
            info.gone = True
            event("expired")
            self.end_with_error(f.request_id, f.error)
        for info in self.queued():  # every expired request under `reject` was failed
            assert not (info.reject and info.deadline_s <= self.now), info

    # -- batch checks ----------------------------------------------------------------------
    def due(self) -> dict:
        queued = self.queued()
        p = self.p
        items = sum(i.request.num_items - i.dispatched for i in queued)
        cost = sum(i.remaining_cost() for i in queued)
        delay_s = min((i.arrival_s for i in queued), default=math.inf) + p.max_queue_delay_s
        earliest = min((i.deadline_s for i in queued if i.deadline_s > self.now), default=math.inf)
        return {
            "items": items,
            "full": items >= p.max_batch_size
            or (p.max_batch_cost is not None and cost >= p.max_batch_cost),
            "preferred": bool(p.preferred_batch_sizes) and items >= p.preferred_batch_sizes[-1],
            # a cold model sends at once when the delay would outlast a deadline
            "deadline": earliest != math.inf and earliest <= delay_s,
            "delay": delay_s <= self.now,
            # idle_dispatch: with no batch in flight nothing is worth waiting for
            "idle": p.idle_dispatch and not self.inflight,
        }

    def check_not_due(self) -> None:
        """A free replica is left idle only while nothing is due (cold model, fixed delay)."""
        if self.mode != "cold" or not self.queued():
            return
        d = self.due()
        assert not (self.draining or d["full"] or d["preferred"] or d["deadline"] or d["delay"]
                    or d["idle"]), d

    def check_reason(self, b: Batch) -> None:
        if self.mode != "cold":
            return
        p, d = self.p, self.due()
        r = b.reason
        assert (r is FlushReason.DRAIN) == self.draining
        if r is FlushReason.FULL:
            assert d["full"]
        elif r is FlushReason.IDLE:
            assert not d["full"] and d["idle"]
        elif r is FlushReason.PREFERRED:
            assert not d["full"] and not d["idle"] and d["preferred"]
        elif r is FlushReason.DEADLINE:
            assert not d["full"] and not d["idle"] and not d["preferred"] and d["deadline"]
        elif r is FlushReason.DELAY:
            assert not (d["full"] or d["idle"] or d["preferred"] or d["deadline"]) and d["delay"]
        if p.max_batch_cost is None:
            fitting = [s for s in p.preferred_batch_sizes if s <= d["items"]]
            target = {
                FlushReason.PREFERRED: p.preferred_batch_sizes[-1] if fitting else None,
                FlushReason.DELAY: fitting[-1] if fitting else p.max_batch_size,
            }.get(r, p.max_batch_size)
            assert b.num_items == min(target, d["items"])

    def take_batch(self, b: Batch) -> None:
        p = self.p
        live = [i for i in self.queued() if i.deadline_s > self.now]
        if any(x.level == y.level and x.seq < y.seq and x.deadline_s > y.deadline_s
               for x in live for y in live):
            event("deadline order differs from arrival order")
        self.check_reason(b)
        assert b.created_s == self.now
        assert b.parts and 1 <= b.num_items <= p.max_batch_size
        assert len(set(b.ids)) == len(b.ids)
        assert b.num_items == sum(part.num_items for part in b.parts)
        cost = 0.0
        for part in b.parts:
            info = self.info[part.request_id]
            assert info.queued, f"request {part.request_id} is not queued"
            assert info.dispatched == part.start < part.stop <= info.request.num_items
            assert not (info.reject and info.deadline_s <= self.now), "expired request sent"
            cost += info.cum[part.stop] - info.cum[part.start]
            info.dispatched = part.stop
        assert b.cost == cost
        event(f"reason {b.reason.value}")
        if any(part.num_items < self.info[part.request_id].request.num_items for part in b.parts):
            event("split")
        if p.max_batch_cost is not None:
            assert b.cost <= p.max_batch_cost
        self.check_order(b)
        self.inflight.append(b)

    def check_order(self, b: Batch) -> None:
        """Nothing of a higher level, nor of an earlier deadline of the same level, still
        waits behind what this batch took (requests already expired excepted in a level)."""
        waiting = self.queued()
        levels = {self.info[part.request_id].level for part in b.parts}
        if any(w.level != lv for w in waiting for lv in levels):
            event("a batch left another level waiting")
        for part in b.parts:
            info = self.info[part.request_id]
            for w in waiting:
                assert not w.level < info.level, (w, info)
                if w.level == info.level and w.deadline_s > self.now < info.deadline_s:
                    assert not w.key < info.key, (w, info)

    # -- the end ---------------------------------------------------------------------------
    def finish(self, order: list[int]) -> None:
        self.q.drain()
        self.draining = True
        self.idle = None
        for _ in range(200):
            if not self.queued():
                break
            self.tick(free=1)
        assert not self.queued() and self.q.queued_requests == 0
        assert self.q.deadline() is None
        for k in order:
            if self.inflight:
                self.complete(k, "ok", 0)
        while self.inflight:
            self.complete(0, "ok", 0)
        assert self.q.take_failures() == []

    def check_outcomes(self) -> None:
        assert len(self.led) == 0
        assert sorted(self.outcomes) == self.opened
        for rid in self.opened:
            (o,) = self.outcomes[rid]  # exactly one outcome each
            expected = self.expected_error.get(rid)
            if expected is None:
                assert o.error is None, (rid, o.error)
                r = self.info[rid].request
                want = [2 * v + 1 for v in r.items]
                got = np.asarray(o.value).tolist()
                assert got == (want[0] if r.single else want), (rid, got, want)
                if self.arrays and not r.single:
                    assert isinstance(o.value, np.ndarray)
            elif expected is BatchSizeMismatch:
                assert isinstance(o.error, BatchSizeMismatch)
            else:
                assert o.error is expected
        if self.p.preserve_ordering:
            assert self.released == self.opened
