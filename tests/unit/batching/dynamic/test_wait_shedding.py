"""Shedding at the wait bound (`max_queue_wait_s`, `batching.dynamic.admission`): a
request already accepted is shed before it runs when the measured service slowed so that
it would start past its bound; not for batches straying within the measured spread, nor
for the first measurement of a service's life taken while its first burst was read. A
fake clock."""

from __future__ import annotations

import pytest

from batching import Overloaded
from tests.unit.batching.dynamic.test_admission import req
from tests.unit.batching.dynamic.test_wait_admission import (  # noqa: F401 (a fixture)
    engine,
    fill,
    measured,
    nothing_unseen,
)


def test_accepted_requests_are_shed_when_the_service_slows_past_their_bound():
    q = engine()
    t = measured(q, batch_s=0.5)
    assert fill(q, 12, t) == 12  # the last 4 start in 1.0 s at 0.5 s a batch
    a = q.next_batch(t, free_replicas=2)
    q.next_batch(t, free_replicas=1)
    # the first batch took 2 s: a full batch now adds 0.8 s (weighted in), so the 4
    # queued would start at t + 2.8 s, past t + 1 s and a batch: shed before they run
    q.complete(a.id, t + 2.0, compute_s=2.0)
    assert q.next_batch(t + 2.0, free_replicas=1) is None
    shed = q.take_failures()
    assert sorted(f.request_id[-1] for f in shed) == [8, 9, 10, 11]
    assert all(isinstance(f.error, Overloaded) and "slowed" in str(f.error) for f in shed)
    assert q.queued_requests == 0
    assert q.admission.wait_refusals == 4  # shed at the bound: demand past the replicas


def test_what_was_accepted_is_not_shed_for_the_spread_only_for_a_slower_mean():
    """The spread widens the wait at the door; once accepted, a request is shed only if
    the mean prediction says it would start past its bound (a batch on the slow side of
    the measured spread does not take back what was promised)."""
    q = engine()
    t = 0.0
    for k in range(8):  # full batches of 4, alternately 0.05 and 0.45 s: mean 0.25
        for i in range(4):
            q.submit(req(("w", k, i)), now=t)
        b = q.next_batch(t, free_replicas=1)
        t += 0.05 if k % 2 == 0 else 0.45
        q.complete(b.id, t, compute_s=0.25)
    spread_s = q.admission.rate.spread_s
    assert 0.1 < spread_s < 0.2
    assert fill(q, 40, t) == 12  # 2 batches ahead fit with the margin, 3 do not
    t0, started = t, {}
    for n, batch_s in enumerate((0.45, 0.05, 0.45)):  # the slow side first
        b = q.next_batch(t, free_replicas=1)
        assert b is not None and not q.take_failures(), f"shed before batch {n}"
        started.update({p.request_id: t for p in b.parts})
        t += batch_s
        q.complete(b.id, t, compute_s=batch_s)
        # the last batch's wait: at the mean it starts within the bound; with the
        # margin on top it would not (shed, with the margin in the shedding)
        if n == 0:
            assert t + q.admission.wait_s(4, 1, margin=False) <= t0 + 1.0
            assert t + q.admission.wait_s(4, 1) > t0 + 1.0
    assert len(started) == 12 and max(started.values()) <= t0 + 1.0
    assert q.queued_requests == 0 and not q.take_failures()


def test_a_burst_accepted_before_any_rate_is_not_shed_on_the_first_measurement():
    """A service's first burst is accepted on a prediction (here `COLD_BATCH_S`); the
    first full batch is timed while the host still reads the burst (slow), the next ones
    fast. What was accepted is judged only once the rate rests on `SETTLED_GROUPS` groups:
    nothing is shed, all of it starts within the bound."""
    q = engine()
    assert fill(q, 40, 0.0) == 40  # 9 batches ahead of the last, 0.1 s each assumed
    a = q.next_batch(0.0, free_replicas=2)
    running = [q.next_batch(0.0, free_replicas=1)]
    started = {p.request_id: 0.0 for b in (a, running[0]) for p in b.parts}
    q.complete(a.id, 0.2, compute_s=0.01)  # the first sample: 0.2 s a batch
    # on it alone, the last accepted would start 1.6 s from now (it was 0.8 s from 0.2)
    assert q.admission.wait_s(32, 1, margin=False) == pytest.approx(1.6)
    assert not q.admission.rate.settled
    t = 0.2
    while running:
        b = q.next_batch(t, free_replicas=1)
        assert not q.take_failures(), f"shed at t={t:.2f}"
        if b is not None:
            started.update({p.request_id: t for p in b.parts})
            running.append(b)
        t += 0.01
        q.complete(running.pop(0).id, t, compute_s=0.01)
    assert q.admission.rate.settled
    assert len(started) == 40 and max(started.values()) <= 1.0
    assert q.queued_requests == 0 and not q.take_failures()


def test_a_burst_accepted_before_any_rate_is_shed_once_a_slow_rate_settles():
    """The same burst on a replica that really takes 0.2 s a batch: once the rate is
    settled, what would start past the bound is shed, and nothing starts past it."""
    q = engine()
    assert fill(q, 40, 0.0) == 40
    running = [q.next_batch(0.0, free_replicas=2), q.next_batch(0.0, free_replicas=1)]
    started = {p.request_id: 0.0 for b in running for p in b.parts}
    t, shed = 0.0, []
    while running:
        t += 0.2
        q.complete(running.pop(0).id, t, compute_s=0.2)
        b = q.next_batch(t, free_replicas=1)
        failures = q.take_failures()
        assert not failures or q.admission.rate.settled, f"shed unsettled at t={t:.1f}"
        shed += failures
        if b is not None:
            started.update({p.request_id: t for p in b.parts})
            running.append(b)
    assert shed and len(started) + len(shed) == 40
    assert max(started.values()) <= 1.0 + 1e-9
