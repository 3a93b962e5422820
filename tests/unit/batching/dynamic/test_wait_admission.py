"""Admission by predicted wait (`max_queue_wait_s`, `batching.dynamic.admission`): a burst
the replicas can serve inside the bound is accepted whatever its size, past it requests
are refused with Overloaded and a Retry-After from the prediction; a fake clock."""

from __future__ import annotations

import asyncio
import itertools
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batching import (
    DynamicBatcher,
    DynamicPolicy,
    Overloaded,
    QueueFull,
    QueuePolicy,
    Request,
    TimeoutAction,
)
from batching.dynamic import admission
from batching.dynamic.admission import COLD_BATCH_S
from tests.conftest import arun as run
from tests.unit.batching.dynamic.test_admission import req
from tests.unit.batching.dynamic.test_host import Clock, FakeReplica, make_host, spin

REAL_UNSEEN_S = admission.UNSEEN_S


@pytest.fixture(autouse=True, scope="module")
def nothing_unseen():
    """A fake clock has no time the engine does not see: `UNSEEN_S` is 0 here, so that
    the waits below are exact; its own test puts it back."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(admission, "UNSEEN_S", 0.0)
        yield


def engine(batch: int = 4, wait_s: float | None = 1.0, **policy) -> DynamicBatcher:
    return DynamicBatcher(DynamicPolicy(max_batch_size=batch, max_queue_wait_s=wait_s,
                                        **policy))


def measured(q: DynamicBatcher, batch_s: float) -> float:
    """Two full batches back to back on one replica from t=0 (a full batch then adds
    `batch_s` to a wait); returns when they ended, with nothing queued or in flight."""
    size = q.policy.max_batch_size
    for i in range(2 * size):
        q.submit(req(("w", i)), now=0.0)
    a = q.next_batch(0.0, free_replicas=2)
    b = q.next_batch(0.0, free_replicas=1)
    assert a.num_items == b.num_items == size
    q.complete(a.id, batch_s, compute_s=batch_s)
    q.complete(b.id, 2 * batch_s, compute_s=batch_s)
    return 2 * batch_s


def fill(q: DynamicBatcher, n: int, now: float, **kw) -> int:
    """Submit `n` single-item requests; how many were accepted before the first refusal."""
    for i in range(n):
        try:
            q.submit(req(("b", q.queued_requests, now, i), **kw), now=now)
        except Overloaded:
            return i
    return n


def test_a_burst_the_replicas_serve_inside_the_bound_is_accepted_whatever_its_size():
    q = engine(batch=64)
    t = measured(q, batch_s=1 / 64)  # 64 batches of 64 a second: 4096 items
    assert fill(q, 4096, t) == 4096  # the last one waits for 63 batches: 0.98 s
    assert q.queued_requests == 4096
    # with no wait bound the count bound alone holds: far fewer in the same burst
    counted = DynamicBatcher(DynamicPolicy(max_batch_size=64, default_queue_policy=QueuePolicy(
        max_queue_size=512)))
    with pytest.raises(QueueFull):
        fill(counted, 4096, 0.0)


def test_past_the_bound_it_refuses_with_a_retry_after_from_the_prediction():
    q = engine()
    t = measured(q, batch_s=0.5)  # a full batch of 4 every 0.5 s
    assert fill(q, 12, t) == 12  # the 12th waits for 2 batches: 1.0 s, the bound
    with pytest.raises(Overloaded, match=r"wait about 1\.50 s \(3 batches ahead .* 500\.0 ms "
                                         r"each .* measured\), past the bound of 1\.00 s") as e:
        q.submit(req("late"), now=t)
    assert e.value.retry_after_s == pytest.approx(0.5)
    assert "late" not in q._queued and q.queued_requests == 12  # nothing kept
    assert q.admission.wait_refusals == 1  # what the replica pool scales up on
    # in flight counts as ahead: two batches leave, one still queued; still 1.5 s
    a = q.next_batch(t, free_replicas=2)
    q.next_batch(t, free_replicas=1)
    with pytest.raises(Overloaded):
        q.submit(req("late"), now=t)
    # once one batch is back (the retry-after), the last batch leaves and it fits: 1.0 s
    q.complete(a.id, t + 0.5, compute_s=0.5)
    assert q.next_batch(t + 0.5, free_replicas=1).num_items == 4
    q.submit(req("late"), now=t + 0.5)


def test_batches_that_stray_from_their_mean_time_widen_the_predicted_wait():
    q = engine()
    t = 0.0
    for k in range(8):  # full batches of 4, one at a time, alternately 0.2 and 0.3 s
        for i in range(4):
            q.submit(req(("w", k, i)), now=t)
        b = q.next_batch(t, free_replicas=1)
        t += 0.2 if k % 2 == 0 else 0.3
        q.complete(b.id, t, compute_s=0.25)
    _, share_s, basis = q.admission.batch_share(1)
    spread_s = q.admission.rate.spread_s
    assert basis == "measured" and 0.24 < share_s < 0.25 and 0.03 < spread_s < 0.06
    # n batches ahead: n shares, plus twice the spread of n batches (sqrt(n) of one's)
    for n in range(1, 6):
        assert q.admission.wait_s(4 * n, 1) == pytest.approx(
            n * share_s + 2 * spread_s * math.sqrt(n))
    # 4 batches ahead fit the 1 s bound at the mean (0.98 s) but not with the spread:
    # requests 17-20 are refused, the 16 before them wait at most 3 batches (0.9 s)
    assert 4 * share_s <= 1.0
    assert fill(q, 40, t) == 16
    with pytest.raises(Overloaded, match=r"would wait about 1\.1\d s \(4 batches ahead"):
        q.submit(req("late"), now=t)
    assert q.admission.wait_s(0, 1) == 0.0  # a request that starts the next batch waits none


def test_a_wait_keeps_room_for_the_time_the_engine_does_not_see(monkeypatch):
    """`UNSEEN_S` (a request's reading and its answer's way back) is added to a wait at
    the door: a request whose batches ahead end exactly at the bound is refused, since
    its client would see it past the bound and its batch. Shedding goes without it."""
    monkeypatch.setattr(admission, "UNSEEN_S", REAL_UNSEEN_S)
    assert 0 < REAL_UNSEEN_S < 0.05
    q = engine()
    t = measured(q, batch_s=0.5)  # no spread: each batch took 0.5 s
    assert q.admission.wait_s(8, 1) == pytest.approx(1.0 + REAL_UNSEEN_S)
    assert q.admission.wait_s(8, 1, margin=False) == pytest.approx(1.0)
    assert q.admission.wait_s(0, 1) == 0.0  # it starts the next batch: no wait at all
    assert fill(q, 12, t) == 8  # the 9th would start at the bound: refused


def test_two_replicas_out_of_phase_are_not_counted_as_batches_that_stray():
    """Two replicas, each taking exactly 66 ms a batch, finish 10 ms apart: the gaps
    between completions alternate 56 and 10 ms. Measured one by one they would stray by
    ~23 ms, and their weighted mean leans to the last gaps; in groups of one per replica
    (the engine's replica count) they do not stray, and a batch's share is its 33 ms."""
    def measure(replicas: int) -> tuple[float, float]:
        q = engine()
        q.replicas = replicas
        for i in range(8):
            q.submit(req(("w", i)), now=0.0)
        running = {"a": q.next_batch(0.0, free_replicas=2),
                   "b": q.next_batch(0.0, free_replicas=1)}
        ends = sorted([(k * 0.066 + 0.056, "a") for k in range(1, 40)]
                      + [(k * 0.066 + 0.066, "b") for k in range(1, 40)])
        for n, (t, replica) in enumerate(ends):
            q.complete(running[replica].id, t, compute_s=0.066)
            for i in range(4):
                q.submit(req(("n", n, i)), now=t)
            running[replica] = q.next_batch(t, free_replicas=1)
        return q.admission.batch_share(replicas)[1], q.admission.rate.spread_s

    (share_1, spread_1), (share_2, spread_2) = measure(1), measure(2)
    assert spread_1 > 0.02 and spread_2 < 0.15 * spread_1
    assert share_2 == pytest.approx(0.033, rel=0.01)
    assert share_1 != pytest.approx(0.033, rel=0.05)


def test_a_deadline_sooner_than_the_bound_is_the_bound():
    q = engine(deadline_admission=False)  # the wait bound alone
    t = measured(q, batch_s=0.5)
    fill(q, 4, t)
    q.next_batch(t, free_replicas=1)  # one batch in flight: a wait of 0.5 s
    with pytest.raises(Overloaded, match=r"past its timeout \(0\.25 s left\)") as e:
        q.submit(req("hurried", timeout_s=0.25), now=t)
    assert e.value.retry_after_s == pytest.approx(0.25)
    assert q.admission.wait_refusals == 0  # its own deadline, not the bound: no more replicas
    q.submit(req("patient", timeout_s=0.75), now=t)
    # earliest deadline first: what it goes before is not ahead of it
    fill(q, 8, t)  # two full batches queued behind "patient": 1.5 s
    q.submit(req("soon", timeout_s=0.625), now=t)  # it goes first: in flight only, 0.5 s
    assert q.next_batch(t, free_replicas=1).ids[:2] == ["soon", "patient"]


def test_before_any_batch_was_timed_a_batch_is_assumed_to_take_cold_batch_s():
    q = engine()
    per_bound = int(1.0 / COLD_BATCH_S)  # full batches that fit in the bound
    admitted = fill(q, 1000, 0.0)
    assert admitted == (per_bound + 1) * 4  # it joins the batch not yet full
    with pytest.raises(Overloaded, match="assumed before any batch was timed") as e:
        q.submit(req("next"), now=0.0)
    assert e.value.retry_after_s == pytest.approx(COLD_BATCH_S)
    two = engine()
    two.replicas = 2  # the wait is shared between two replicas
    assert fill(two, 1000, 0.0) == (2 * per_bound + 1) * 4


def test_with_a_timed_batch_but_no_measured_rate_the_latency_model_predicts():
    q = engine()
    q.submit(req("one"), now=0.0)
    b = q.next_batch(0.0, free_replicas=1)  # idle_dispatch off: the delay is 0, so it leaves
    q.complete(b.id, 0.25, compute_s=0.25)  # one item: not a full batch, so no rate
    assert fill(q, 1000, 0.25) == 5 * 4  # 0.25 s a batch: 4 full batches ahead fit
    with pytest.raises(Overloaded, match="predicted"):
        q.submit(req("next"), now=0.25)


def test_a_higher_level_is_not_refused_for_a_lower_levels_queue():
    q = engine(priority_levels=2)
    t = measured(q, batch_s=0.5)
    assert fill(q, 100, t, priority=2) == 12
    assert fill(q, 100, t, priority=1) == 12  # level 1 goes first: the 12 low ones wait


def test_levels_that_run_late_requests_keep_the_bound_not_their_deadline():
    q = engine(deadline_admission=False, default_queue_policy=QueuePolicy(
        timeout_action=TimeoutAction.DELAY))
    t = measured(q, batch_s=0.5)
    assert fill(q, 100, t, timeout_s=0.125) == 12


def test_off_only_the_count_bound_holds():
    q = engine(wait_s=None, deadline_admission=False)
    assert fill(q, 5000, 0.0) == 5000


def test_a_host_slow_to_send_what_is_queued_is_measured_as_the_slower_service_it_is():
    """A replica that computes a batch in 0.1 s, behind a host (an event loop busy with
    other work) that sends the next full batch only 0.4 s after the last came back: the
    time between the two counts, or admission would predict waits 5x too short."""
    q = engine()
    for i in range(8):
        q.submit(req(i), now=0.0)
    a = q.next_batch(0.0, free_replicas=1)
    q.complete(a.id, 0.1, compute_s=0.1)  # 4 per 0.1 s; a full batch still queued
    b = q.next_batch(0.5, free_replicas=1)  # nothing in flight: sent late by the host
    q.complete(b.id, 0.6, compute_s=0.1)  # 4 per 0.5 s since the last came back
    assert q.admission.rate.per_s == pytest.approx(1 / (0.025 + 0.2 * (0.125 - 0.025)))


@settings(max_examples=60, deadline=None)
@given(size=st.integers(1, 16), batch_s=st.sampled_from([1 / 64, 1 / 8, 1 / 4, 1 / 2]),
       bound_s=st.sampled_from([0.25, 0.5, 1.0, 2.0]), levels=st.integers(1, 3),
       inflight=st.integers(0, 2))
def test_property_a_burst_is_accepted_exactly_as_far_as_the_bound_reaches(
        size, batch_s, bound_s, levels, inflight):
    """Into a queue with `inflight` batches running and a measured rate: the requests of a
    burst at any level are accepted while the full batches ahead of them fit in the
    bound (each of its level's own), the first one past it is refused, nothing is kept of
    it, and the other levels are not touched."""
    q = engine(batch=size, wait_s=bound_s, priority_levels=levels)
    t = measured(q, batch_s)
    fill(q, inflight * size, t, priority=1)
    for _ in range(inflight):
        q.next_batch(t, free_replicas=1)
    fits = math.floor(bound_s / batch_s) - inflight  # full batches queued ahead that fit
    expected = max(fits + 1, 0) * size
    for level in range(levels, 0, -1):  # the lowest first: a higher one is not behind it
        assert fill(q, 10 * expected + 1, t, priority=level) == expected
    assert q.queued_requests == levels * expected


# -- through the host: an open-loop overload at 10x what the replica can do ----------------
RATE_PER_S, BATCH, BATCH_S, BOUND_S, SECONDS = 80, 4, 0.5, 1.0, 6


async def overload() -> tuple[list[tuple[float, float]], dict[str, int], list[float]]:
    """A request every 1/80 s for 6 s, no deadlines, one replica running 4 per 0.5 s:
    (submitted at, latency) of the accepted ones, the errors, and the Retry-After hints."""
    clock, replica = Clock(), FakeReplica("r")
    host, _ = make_host(replica, max_batch_size=BATCH, clock=clock, max_queue_wait_s=BOUND_S)
    # two full batches first, so that the rate is measured before the overload starts
    # (before any batch is timed, one is assumed to take 0.1 s, and this replica takes 0.5)
    warm = [host.submit(Request(("w", i), (i,), single=True)) for i in range(2 * BATCH)]
    await spin()
    for _ in range(2):
        clock.now += BATCH_S
        replica.finish(compute_s=BATCH_S)
        await spin()
    assert all(f.done() for f in warm)
    start = clock.now
    sent: dict[int, tuple[float, asyncio.Future]] = {}
    ended: dict[int, float] = {}
    errors: dict[str, int] = {}
    hints: list[float] = []
    steps_per_batch = int(BATCH_S * RATE_PER_S)
    step = 0
    while step < SECONDS * RATE_PER_S or host.open_requests:
        clock.now = start + step / RATE_PER_S
        if step < SECONDS * RATE_PER_S:
            try:
                fut = host.submit(Request(step, (step,), single=True))
                sent[step] = clock.now, fut
                fut.add_done_callback(lambda f, k=step: ended.setdefault(k, clock.now))
            except Overloaded as e:
                errors["Overloaded"] = errors.get("Overloaded", 0) + 1
                hints.append(e.retry_after_s)
        if step % steps_per_batch == steps_per_batch - 1 and replica.pending():
            replica.finish(compute_s=BATCH_S)  # the oldest batch ran the last 0.5 s
        await spin()
        step += 1
    done = []
    for k, (t, fut) in sent.items():
        assert fut.done(), k
        if fut.exception() is not None:  # shed: its prediction was too short
            assert isinstance(fut.exception(), Overloaded), fut.exception()
            errors["shed"] = errors.get("shed", 0) + 1
            continue
        assert fut.result() == f"r:{k * k}"
        done.append((t, ended[k] - t))
    return done, errors, hints


def test_at_ten_times_capacity_accepted_requests_wait_at_most_the_bound():
    done, errors, hints = run(overload())
    assert set(errors) <= {"Overloaded", "shed"}, errors
    assert errors["Overloaded"] > 0.5 * SECONDS * RATE_PER_S
    # a few accepted while half-empty batches were in flight (counted by their cost, so
    # the next batches fill up) waited longer than predicted: shed before they ran
    assert errors.get("shed", 0) <= 0.2 * len(done), (errors, len(done))
    # every request served waited at most the bound: its latency is at most the bound
    # and its own batch
    latencies = [latency for _, latency in done]
    assert max(latencies) <= BOUND_S + BATCH_S, sorted(latencies)[-5:]
    assert all(0 < h <= BATCH_S + 1e-9 for h in hints)  # the next batch back lets it in
    # the replica was kept busy: at least 80% of its 8/s
    assert len(done) >= 0.8 * SECONDS * BATCH / BATCH_S, (len(done), errors)


def test_the_host_tells_the_engine_how_many_replicas_share_the_wait():
    async def main():
        host, _ = make_host(FakeReplica("a"), FakeReplica("b"), max_batch_size=4,
                            max_queue_wait_s=1.0)
        assert host.engine.replicas == 2
        assert host.stats()["admission"] == {  # what `raybatch status` and the bench show
            "max_queue_wait_s": 1.0, "full_batch_cost": 4.0,
            "batch_share_ms": pytest.approx(COLD_BATCH_S * 1e3 / 2), "batch_spread_ms": 0.0,
            "basis": "assumed before any batch was timed"}
        host.remove_replica(host.replicas[0])
        assert host.engine.replicas == 1

    run(main())


def test_a_replicas_warm_up_batches_seed_the_prediction_before_any_batch_is_timed():
    async def main():
        host, _ = make_host(FakeReplica("a"), max_batch_size=4, max_queue_wait_s=1.0)
        host.seed_latency([(1, 0.25)])  # one warm-up batch of 1 item took 0.25 s
        assert host.stats()["admission"]["basis"] == "predicted"
        assert host.stats()["admission"]["batch_share_ms"] == pytest.approx(250.0)
        host.seed_latency([(1, 5.0)])  # a later replica's does not replace what is known
        assert host.stats()["admission"]["batch_share_ms"] == pytest.approx(250.0)

    run(main())


@settings(max_examples=300, deadline=None, database=None)
@given(steps=st.lists(st.tuples(st.sampled_from(["submit", "dispatch", "complete"]),
                                st.integers(1, 6), st.floats(0.0, 0.4),
                                st.sampled_from([None, 0.3, 1.0, 5.0]),
                                st.sampled_from([None, 1, 2])),
                      min_size=1, max_size=60),
       batch_s=st.floats(0.01, 0.5))
def test_the_shortcut_past_the_shedding_walk_never_changes_what_is_shed(steps, batch_s):
    """`Admission._none_due` skips the walk over the queue when nothing can be due: run
    the same schedule on an engine without the shortcut, and every refusal, shed request
    and batch is the same."""
    def make() -> DynamicBatcher:
        return DynamicBatcher(DynamicPolicy(
            max_batch_size=4, max_queue_wait_s=0.5,
            priority_levels=2, priority_queue_policy={2: QueuePolicy(default_timeout_s=2.0)}))

    fast, walked = make(), make()
    walked._admission._none_due = lambda *a: False  # always the full walk
    for q in (fast, walked):
        q._admission.walk_gap_per_entry_s = 0.0  # every walk that is due (see below)
    seen: list[list] = [[], []]
    t = measured(fast, batch_s)
    assert measured(walked, batch_s) == t
    inflight: list[list[int]] = [[], []]
    for n, (op, size, dt, timeout_s, priority) in enumerate(steps):
        t += dt
        for q, log, flying in ((fast, seen[0], inflight[0]), (walked, seen[1], inflight[1])):
            if op == "submit":
                try:
                    q.submit(req(("s", n), size, timeout_s, priority), now=t)
                    log.append(("accepted", n))
                except Overloaded:
                    log.append(("refused", n))
            elif op == "dispatch":
                b = q.next_batch(t, free_replicas=1)
                if b is not None:
                    flying.append(b.id)
                    log.append(("batch", [(p.request_id, p.start, p.stop) for p in b.parts]))
            elif flying:
                q.complete(flying.pop(0), t, compute_s=batch_s * size / 2)  # it slows
            log.extend(("failed", f.request_id, type(f.error).__name__)
                       for f in q.take_failures())
    assert seen[0] == seen[1]


def test_under_overload_the_queue_is_walked_at_most_once_per_gap_for_each_entry():
    """When the shortcut cannot rule shedding out, `shed` walks the queue at most once per
    `WALK_GAP_PER_ENTRY_S` per queued entry, so its CPU stays bounded however deep the
    queue; what became due for shedding is shed at the first walk."""
    q = engine(batch=4, wait_s=1.0)
    t = measured(q, batch_s=0.1)  # a full batch adds 0.1 s to a wait
    queued = fill(q, 100, t)  # up to the bound
    admission = q._admission
    admission._none_due = lambda *a: False  # as under overload: the shortcut never helps
    walks, last = [], admission._next_walk_s

    def step(now: float) -> None:
        nonlocal last
        q._shed_due = True  # as after a completion: the engine asks admission to shed
        q.next_batch(now, free_replicas=0)
        if admission._next_walk_s != last:  # the queue was walked at `now`
            walks.append(now)
            last = admission._next_walk_s

    gap = queued * admission.walk_gap_per_entry_s
    for i in range(100):
        now = t + i * gap / 10
        step(now)
    assert walks[0] == t and len(walks) == 10, (walks, gap)
    assert all(b - a >= gap - 1e-9 for a, b in itertools.pairwise(walks)), walks
    q.take_failures()  # the last one accepted: no batch ran meanwhile, so it was shed
    # the service slows: full batches now take 0.4 s; the next walk sheds the tail
    for _ in range(2):
        b = q.next_batch(now, free_replicas=1)
        now += 0.4
        q.complete(b.id, now, compute_s=0.4)
    step(now)
    assert walks[-1] == now and q.take_failures()
