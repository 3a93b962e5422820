"""group_by_length: the request next in line still goes first, its batch-mates are the
queued requests nearest to it in length; off, the order is untouched."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from batching import DynamicBatcher, DynamicPolicy, Part, Request


def lengths(**kw) -> DynamicBatcher:
    policy = DynamicPolicy(group_by_length=True, length_fn=lambda items: items[0], **kw)
    return DynamicBatcher(policy)


def submit(q: DynamicBatcher, rid: str, length: int, n: int = 1, now: float = 0.0, **kw):
    q.submit(Request(rid, (length,) * n, **kw), now=now)


def test_batches_hold_similar_lengths_and_start_with_the_oldest():
    q = lengths(max_batch_size=2, max_queue_delay_s=1.0)
    for i, (rid, length) in enumerate([("a", 50), ("b", 5), ("c", 48), ("d", 6)]):
        submit(q, rid, length, now=0.001 * i)
    assert q.next_batch(now=0.01, free_replicas=1).ids == ["a", "c"]
    assert q.next_batch(now=0.01, free_replicas=1).ids == ["b", "d"]
    assert q.queued_requests == 0 and q.queued_items == 0


def test_without_grouping_the_order_is_arrival_order():
    q = DynamicBatcher(DynamicPolicy(max_batch_size=2, max_queue_delay_s=1.0))
    for i, (rid, length) in enumerate([("a", 50), ("b", 5), ("c", 48), ("d", 6)]):
        submit(q, rid, length, now=0.001 * i)
    assert q.next_batch(now=0.01, free_replicas=1).ids == ["a", "b"]


def test_the_range_of_lengths_grows_as_little_as_possible():
    q = lengths(max_batch_size=3, max_queue_delay_s=1.0)
    for i, (rid, length) in enumerate([("a", 10), ("b", 30), ("c", 12), ("d", 1), ("e", 13)]):
        submit(q, rid, length, now=0.001 * i)
    assert sorted(q.next_batch(now=0.01, free_replicas=1).ids) == ["a", "c", "e"]


def test_a_request_that_does_not_fit_is_split_and_its_rest_stays_queued():
    q = lengths(max_batch_size=4, max_queue_delay_s=1.0)
    submit(q, "a", 10, n=2)
    submit(q, "b", 90, n=1, now=0.001)
    submit(q, "c", 11, n=3, now=0.002)
    batch = q.next_batch(now=0.01, free_replicas=1)
    assert batch.parts == (Part("a", 0, 2), Part("c", 0, 2))
    rest = q.next_batch(now=1.01, free_replicas=1)  # the delay counts from b, now oldest
    assert sorted(rest.parts, key=str) == sorted((Part("b", 0, 1), Part("c", 2, 3)), key=str)
    assert q.queued_items == 0


def test_grouping_stays_within_the_highest_priority_level_first():
    q = lengths(max_batch_size=2, max_queue_delay_s=0.0, priority_levels=2)
    submit(q, "low-near", 10, priority=2)
    submit(q, "high-far", 99, priority=1, now=0.001)
    submit(q, "high-anchor", 10, priority=1)
    assert sorted(q.next_batch(now=0.01, free_replicas=1).ids) == ["high-anchor", "high-far"]


def test_the_window_bounds_which_requests_are_looked_at():
    q = lengths(max_batch_size=2, max_queue_delay_s=1.0, length_window=2)
    for i, (rid, length) in enumerate([("a", 10), ("b", 50), ("c", 10)]):
        submit(q, rid, length, now=0.001 * i)
    assert q.next_batch(now=0.01, free_replicas=1).ids == ["a", "b"]


def test_cancelled_requests_are_never_grouped():
    q = lengths(max_batch_size=2, max_queue_delay_s=0.0)
    submit(q, "a", 10)
    submit(q, "b", 10)
    submit(q, "c", 40)
    q.cancel("b", now=0.0)
    assert q.next_batch(now=0.0, free_replicas=1).ids == ["a", "c"]


def test_grouping_without_a_length_fn_is_refused_at_once():
    with pytest.raises(ValueError, match="needs a length_fn"):
        DynamicBatcher(DynamicPolicy(group_by_length=True))


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(1, 60), st.integers(1, 4), st.integers(1, 2)),
                min_size=1, max_size=25),
       st.integers(1, 6), st.integers(1, 30), st.sets(st.integers(0, 24), max_size=5))
def test_every_item_leaves_once_within_limits_and_each_batch_starts_in_line(
        requests, max_bs, window, cancelled):
    q = lengths(max_batch_size=max_bs, max_queue_delay_s=0.0, priority_levels=2,
                length_window=window)
    left: dict[int, int] = {}  # request -> items not yet sent
    for i, (length, n, prio) in enumerate(requests):
        submit(q, i, length, n=n, priority=prio)
        left[i] = n
    for i in cancelled & set(left):
        q.cancel(i, now=0.0)
        del left[i]
    sent: dict[int, list[tuple[int, int]]] = {i: [] for i in left}
    while (batch := q.next_batch(now=0.0, free_replicas=1)) is not None:
        assert 1 <= batch.num_items <= max_bs
        first = batch.parts[0].request_id
        in_line = min((requests[i][2], i) for i, n in left.items() if n)  # level, arrival
        assert first == in_line[1]  # the anchor is whoever the plain order sends next
        for p in batch.parts:
            sent[p.request_id].append((p.start, p.stop))
            left[p.request_id] -= p.num_items
    assert all(n == 0 for n in left.values())
    for i, spans in sent.items():  # each item exactly once, in order
        assert [x for a, b in sorted(spans) for x in range(a, b)] == list(range(requests[i][1]))
