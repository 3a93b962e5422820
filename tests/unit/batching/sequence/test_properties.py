"""Hypothesis properties of SequenceBatcher under random schedules, checked by a fake host.

Random submits (starts, steps, ends, timeouts, bad ids), ticks with random free
batch places, completions (ok, failed, some rows lost), cancels, replicas added
and removed, and time passing (idle timeouts). The host tracks each sequence
incarnation (one accepted start = one incarnation) independently and checks:
every accepted request ends exactly once; a sequence's requests are dispatched
in submission order, never two at once, always to the replica (and, direct,
the slot) holding it; no replica ever holds more sequences than its slots.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from batching import InvalidRequest, QueueFull, SequenceLost, UnknownSequence
from batching.sequence.batcher import SequenceBatch, SequenceBatcher, SequenceRequest
from batching.sequence.policy import SequencePolicy

SIDS = [1, 2, "a", "b"]
DTS = [0.0, 0.0, 0.25, 0.5, 1.0]

policies = st.builds(
    SequencePolicy,
    strategy=st.sampled_from(["direct", "oldest"]),
    max_batch_size=st.integers(1, 3),
    max_queue_delay_s=st.sampled_from([0.0, 0.0, 0.5]),
    max_sequence_idle_s=st.sampled_from([0.5, 1.0, 2.0]),
    max_pending_sequences=st.sampled_from([None, 0, 1, 3]),
)
timeouts = st.sampled_from([None] * 6 + [0.25, 1.0])
ends = st.sampled_from([False, False, False, True])
starts = st.tuples(st.just("submit"), st.sampled_from(SIDS), st.just(True), ends, timeouts)
steps = st.tuples(st.just("step"), st.integers(0, 7), ends, timeouts)
stray = st.tuples(st.just("submit"), st.sampled_from(SIDS), st.just(False), st.booleans(),
                  st.none())
bad_ids = st.tuples(st.just("submit"), st.sampled_from([0, ""]), st.booleans(), st.booleans(),
                    st.none())
ticks = st.tuples(st.just("tick"), st.sampled_from(DTS), st.integers(0, 2), st.integers(0, 2))
completes = st.tuples(st.just("complete"), st.integers(0, 20),
                      st.sampled_from(["ok", "ok", "ok", "fail", "lost"]))
ops = st.one_of(starts, steps, steps, steps, ticks, ticks, completes, completes,
                st.tuples(st.just("cancel"), st.integers(0, 40)), bad_ids, stray,
                st.tuples(st.just("remove"), st.integers(0, 3)), st.tuples(st.just("add")))


@dataclass(eq=False)
class Inc:
    """One incarnation of a sequence: its accepted requests and where it lives."""

    sid: object
    requests: list = field(default_factory=list)  # request ids in submission order
    dispatched: list = field(default_factory=list)
    replica: object = None
    slot: int | None = None
    running: object = None


class Host:
    def __init__(self, policy: SequencePolicy) -> None:
        self.p = policy
        self.q = SequenceBatcher(policy)
        self.now = 0.0
        self.rids = itertools.count()
        self.replica_names = itertools.count()
        self.replicas: list = []
        self.current: dict = {}  # sid -> its latest Inc (as far as the host knows)
        self.inc_of: dict = {}  # request id -> Inc
        self.outcomes: dict = {}  # request id -> number of outcomes
        self.inflight: dict[int, SequenceBatch] = {}
        self.holds: dict = {}  # replica -> set of Inc holding state there
        self.add()
        self.add()

    # -- operations ------------------------------------------------------------------------
    def add(self) -> None:
        key = f"r{next(self.replica_names)}"
        self.replicas.append(key)
        self.holds[key] = set()
        self.q.add_replica(key, self.now)

    def remove(self, i: int) -> None:
        if not self.replicas:
            return
        key = self.replicas.pop(i % len(self.replicas))
        lost = set(self.q.remove_replica(key, self.now))
        held = self.holds.pop(key)
        assert lost == {inc.sid for inc in held}, (lost, held)
        self.take()

    def submit(self, sid, start: bool, end: bool, timeout_s) -> None:
        rid = next(self.rids)
        try:
            self.q.submit(SequenceRequest(rid, sid, rid, start, end, timeout_s), self.now)
        except (UnknownSequence, SequenceLost, QueueFull, InvalidRequest) as e:
            event(f"refused {type(e).__name__}")
            assert sid not in (0, "") or isinstance(e, InvalidRequest)
            return
        assert sid not in (0, "")
        event("accepted start" if start else "accepted end" if end else "accepted step")
        if start:
            self.current[sid] = Inc(sid)
        inc = self.current[sid]
        inc.requests.append(rid)
        self.inc_of[rid] = inc
        self.outcomes[rid] = 0

    def step(self, k: int, end: bool, timeout_s) -> None:
        """A request of a sequence this host started (it may have ended since)."""
        sids = list(self.current) or SIDS
        self.submit(sids[k % len(sids)], False, end, timeout_s)

    def tick(self, dt: float, free: list[int]) -> None:
        self.now += dt
        free_by = {k: free[i % len(free)] for i, k in enumerate(self.replicas)}
        while (batch := self.q.next_batch(self.now, free_by)) is not None:
            assert free_by[batch.replica] > 0
            free_by[batch.replica] -= 1
            self.take()  # the host sends releases before the batch
            self.dispatch(batch)
        self.take()
        deadline = self.q.deadline()
        assert deadline is None or deadline > self.now or not any(free_by.values())

    def dispatch(self, batch: SequenceBatch) -> None:
        assert 0 < batch.num_items <= self.p.max_batch_size and batch.rows <= self.p.max_batch_size
        assert max(batch.slots) < self.p.sequences_per_replica
        event(f"dispatched {'not ' if batch.num_items < batch.rows else ''}all ready")
        for rid, ok, start, slot in zip(batch.request_ids, batch.ready, batch.start,
                                        batch.slots):
            if not ok:
                assert rid is None
                continue
            inc = self.inc_of[rid]
            assert inc.running is None, "two requests of one sequence in flight"
            done = inc.requests.index(inc.dispatched[-1]) + 1 if inc.dispatched else 0
            skipped = inc.requests[done:inc.requests.index(rid)]
            assert all(self.outcomes[r] == 1 for r in skipped), "out of submission order"
            assert start == (not inc.dispatched)
            if start:
                inc.replica, inc.slot = batch.replica, slot
                self.holds[batch.replica].add(inc)
                assert len(self.holds[batch.replica]) <= self.p.sequences_per_replica
            assert (inc.replica, inc.slot) == (batch.replica, slot), "not sticky"
            inc.running = rid
            inc.dispatched.append(rid)
        self.inflight[batch.id] = batch

    def complete(self, i: int, how: str) -> None:
        if not self.inflight:
            return
        batch = self.inflight.pop(sorted(self.inflight)[i % len(self.inflight)])
        lost = [sid for sid, ok, s in zip(batch.sequence_ids, batch.ready, batch.start)
                if ok and not s] if how == "lost" else []
        for rid in batch.ids:
            inc = self.inc_of[rid]
            inc.running = None
            self.end(rid)
            last = batch.end[batch.request_ids.index(rid)] and how != "fail"
            if (last or inc.sid in lost) and batch.replica in self.holds:
                self.holds[batch.replica].discard(inc)
        if how == "fail":
            self.q.fail(batch.id, self.now)
        else:
            self.q.complete(batch.id, self.now, lost)
        self.take()

    def cancel(self, i: int) -> None:
        open_ = [rid for rid, n in self.outcomes.items() if n == 0]
        if open_:
            rid = open_[i % len(open_)]
            inc = self.inc_of[rid]
            if self.q.cancel(rid, self.now):
                assert rid not in inc.dispatched
                self.end(rid)
            else:
                assert rid in inc.dispatched
            self.take()

    # -- bookkeeping -----------------------------------------------------------------------
    def end(self, rid) -> None:
        self.outcomes[rid] += 1
        assert self.outcomes[rid] == 1, f"request {rid} ended twice"

    def take(self) -> None:
        for f in self.q.take_failures():
            assert f.request_id not in self.inc_of[f.request_id].dispatched
            event(f"failed {type(f.error).__name__}")
            self.end(f.request_id)
        for key, sids in self.q.take_releases().items():
            held = {inc.sid: inc for inc in self.holds[key]}
            for sid in sids:
                event("released")
                assert sid in held, f"released {sid} that {key} does not hold"
                self.holds[key].discard(held[sid])

    def finish(self) -> None:
        """Run everything to the end: each accepted request must end exactly once."""
        if not self.replicas:
            self.add()
        for _ in range(500):
            self.tick(100.0, [1])
            while self.inflight:
                self.complete(0, "ok")
            if not (self.q.queued_requests or self.q.pending_sequences):
                break
        self.tick(1000.0, [1])  # idle timeouts free every live sequence
        assert self.q.queued_requests == 0 and self.q.live_sequences == 0
        assert all(n == 1 for n in self.outcomes.values())
        assert all(not held for held in self.holds.values())


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(policy=policies, schedule=st.lists(ops, min_size=20, max_size=80))
def test_random_schedules_keep_every_sequence_invariant(policy, schedule):
    h = Host(policy)
    for op in schedule:
        kind, *args = op
        if kind == "tick":
            h.tick(args[0], args[1:])
        else:
            getattr(h, kind)(*args)
    h.finish()
