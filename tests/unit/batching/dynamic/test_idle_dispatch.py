"""`idle_dispatch`: no wait when nothing is in flight, the delay again under load."""

from __future__ import annotations

from batching import DynamicBatcher, DynamicPolicy, FlushReason


def batcher(**kw) -> DynamicBatcher:
    return DynamicBatcher(DynamicPolicy(max_batch_size=4, max_queue_delay_s=0.010, **kw))


def test_a_lone_request_leaves_at_once_when_nothing_is_in_flight(req):
    q = batcher(idle_dispatch=True)
    q.submit(req("a"), now=0.0)
    assert q.deadline() == 0.0  # due now
    b = q.next_batch(now=0.0, free_replicas=2)
    assert (b.ids, b.reason) == (["a"], FlushReason.IDLE)


def test_with_a_batch_in_flight_the_next_request_waits_the_delay(req):
    q = batcher(idle_dispatch=True)
    q.submit(req("a"), now=0.0)
    first = q.next_batch(now=0.0, free_replicas=2)
    q.submit(req("b"), now=0.001)
    assert q.deadline() == 0.011
    assert q.next_batch(now=0.010, free_replicas=1) is None
    assert (q.next_batch(now=0.011, free_replicas=1).reason) == FlushReason.DELAY
    assert first.reason == FlushReason.IDLE


def test_once_everything_in_flight_completes_the_queue_is_sent_at_once(req):
    q = batcher(idle_dispatch=True)
    q.submit(req("a"), now=0.0)
    a = q.next_batch(now=0.0, free_replicas=2)
    q.submit(req("b"), now=0.001)
    q.submit(req("c"), now=0.002)
    assert q.next_batch(now=0.003, free_replicas=1) is None  # "a" still runs
    q.complete(a.id, now=0.004)
    assert q.deadline() == 0.001  # the oldest arrival: due now
    b = q.next_batch(now=0.004, free_replicas=2)
    assert (b.ids, b.reason) == (["b", "c"], FlushReason.IDLE)


def test_an_idle_batch_takes_up_to_max_batch_size_and_the_rest_waits(req):
    q = batcher(idle_dispatch=True)
    for rid in "abcdef":
        q.submit(req(rid), now=0.0)
    full = q.next_batch(now=0.0, free_replicas=2)
    assert (full.ids, full.reason) == (list("abcd"), FlushReason.FULL)
    assert q.next_batch(now=0.0, free_replicas=1) is None  # "abcd" is in flight now
    assert q.next_batch(now=0.010, free_replicas=1).ids == ["e", "f"]


def test_no_free_replica_means_no_idle_dispatch(req):
    q = batcher(idle_dispatch=True)
    q.submit(req("a"), now=0.0)
    assert q.next_batch(now=0.0, free_replicas=0) is None
    assert q.next_batch(now=0.0, free_replicas=1).reason == FlushReason.IDLE


def test_off_by_default_a_lone_request_waits_the_delay_as_in_triton(req):
    q = batcher()
    q.submit(req("a"), now=0.0)
    assert q.deadline() == 0.010
    assert q.next_batch(now=0.0, free_replicas=2) is None
    assert q.next_batch(now=0.010, free_replicas=2).reason == FlushReason.DELAY


def test_a_failed_batch_counts_as_no_longer_in_flight(req):
    q = batcher(idle_dispatch=True)
    q.submit(req("a"), now=0.0)
    a = q.next_batch(now=0.0, free_replicas=1)
    q.submit(req("b"), now=0.001)
    q.complete(a.id, now=0.002, failed=True)
    assert q.next_batch(now=0.002, free_replicas=1).reason == FlushReason.IDLE
