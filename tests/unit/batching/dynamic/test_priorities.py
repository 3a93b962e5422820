"""Priority levels, the queue policy of each level, and per-request deadlines."""

from __future__ import annotations

import pytest

from batching import (
    DeadlineExceeded,
    DynamicBatcher,
    DynamicPolicy,
    InvalidRequest,
    Part,
    QueueFull,
    QueuePolicy,
    TimeoutAction,
)


def batcher(**kw) -> DynamicBatcher:
    return DynamicBatcher(DynamicPolicy(**kw))


def failed_ids(q: DynamicBatcher) -> list:
    out = []
    for f in q.take_failures():
        assert isinstance(f.error, DeadlineExceeded)
        out.append(f.request_id)
    return out


# -- priority levels -----------------------------------------------------------------------
def test_level_one_is_served_first_whatever_the_arrival_order(req):
    q = batcher(max_batch_size=2, max_queue_delay_s=0.0, priority_levels=3)
    q.submit(req("low", priority=3), now=0.0)
    q.submit(req("mid", priority=2), now=0.1)
    q.submit(req("high", priority=1), now=0.2)
    assert q.next_batch(now=0.2, free_replicas=1).ids == ["high", "mid"]
    assert q.next_batch(now=0.2, free_replicas=1).ids == ["low"]


def test_lower_level_only_fills_room_left_by_higher_levels(req):
    q = batcher(max_batch_size=4, max_queue_delay_s=0.0, priority_levels=2)
    q.submit(req("low", 3, priority=2), now=0.0)
    q.submit(req("high", 3, priority=1), now=0.0)
    b = q.next_batch(now=0.0, free_replicas=1)
    assert b.parts == (Part("high", 0, 3), Part("low", 0, 1))


def test_a_split_high_priority_request_keeps_lower_levels_out(req):
    q = batcher(max_batch_size=2, max_queue_delay_s=0.0, priority_levels=2)
    q.submit(req("low", priority=2), now=0.0)
    q.submit(req("high", 5, priority=1), now=0.0)
    assert q.next_batch(now=0.0, free_replicas=1).parts == (Part("high", 0, 2),)
    assert q.next_batch(now=0.0, free_replicas=1).parts == (Part("high", 2, 4),)
    assert q.next_batch(now=0.0, free_replicas=1).parts == (Part("high", 4, 5), Part("low", 0, 1))


def test_lower_level_never_fills_cost_room_a_higher_level_could_not_use(req):
    q = batcher(max_batch_size=8, max_batch_cost=10, cost_fn=lambda x: x, max_queue_delay_s=0.0,
                priority_levels=2)
    q.submit(req("hi", items=[6, 6], priority=1), now=0.0)
    q.submit(req("lo", items=[1], priority=2), now=0.0)
    assert q.next_batch(now=0.0, free_replicas=1).parts == (Part("hi", 0, 1),)
    assert q.next_batch(now=0.0, free_replicas=1).parts == (Part("hi", 1, 2), Part("lo", 0, 1))


def test_request_without_priority_goes_to_the_lowest_level_by_default(req):
    q = batcher(max_batch_size=1, max_queue_delay_s=0.0, priority_levels=3)
    q.submit(req("none"), now=0.0)
    q.submit(req("zero", priority=0), now=0.0)  # 0 means "the default", as in Triton
    q.submit(req("three", priority=3), now=0.0)
    q.submit(req("two", priority=2), now=0.0)
    order = [q.next_batch(now=0.0, free_replicas=1).ids[0] for _ in range(4)]
    assert order == ["two", "none", "zero", "three"]


def test_default_priority_level_places_requests_that_name_none(req):
    q = batcher(max_batch_size=1, max_queue_delay_s=0.0, priority_levels=3,
                default_priority_level=2)
    q.submit(req("three", priority=3), now=0.0)
    q.submit(req("default"), now=0.0)
    q.submit(req("one", priority=1), now=0.0)
    order = [q.next_batch(now=0.0, free_replicas=1).ids[0] for _ in range(3)]
    assert order == ["one", "default", "three"]


@pytest.mark.parametrize("priority", [-1, 4])
def test_priority_out_of_range_is_an_invalid_request(req, priority):
    q = batcher(priority_levels=3)
    with pytest.raises(InvalidRequest, match=rf"priority={priority}.*1\.\.3"):
        q.submit(req("a", priority=priority), now=0.0)
    assert q.queued_requests == 0


# -- max_queue_size ------------------------------------------------------------------------
def test_full_level_rejects_at_once_and_keeps_nothing(req):
    q = batcher(max_batch_size=8, max_queue_delay_s=1.0, priority_levels=2,
                priority_queue_policy={1: QueuePolicy(max_queue_size=2)})
    q.submit(req("a", priority=1), now=0.0)
    q.submit(req("b", 3, priority=1), now=0.0)
    with pytest.raises(QueueFull, match="max_queue_size=2"):
        q.submit(req("c", priority=1), now=0.0)
    assert (q.queued_requests, q.queued_items) == (2, 4)
    q.submit(req("c", priority=2), now=0.0)  # another level has its own (unbounded) queue
    assert q.next_batch(now=1.0, free_replicas=1).ids == ["a", "b", "c"]


def test_queue_size_counts_requests_not_items(req):
    q = batcher(max_batch_size=8, max_queue_delay_s=1.0,
                default_queue_policy=QueuePolicy(max_queue_size=2))
    q.submit(req("a", 5), now=0.0)
    q.submit(req("b", 5), now=0.0)
    with pytest.raises(QueueFull):
        q.submit(req("c"), now=0.0)


def test_a_full_queue_takes_requests_again_once_one_left(req):
    q = batcher(max_batch_size=1, max_queue_delay_s=0.0,
                default_queue_policy=QueuePolicy(max_queue_size=1))
    q.submit(req("a", 2), now=0.0)
    assert q.next_batch(now=0.0, free_replicas=1).parts == (Part("a", 0, 1),)
    with pytest.raises(QueueFull):  # the rest of "a" still waits
        q.submit(req("b"), now=0.0)
    q.next_batch(now=0.0, free_replicas=1)
    q.submit(req("b"), now=0.0)
    q.cancel("b", now=0.0)
    q.submit(req("c"), now=0.0)


# -- timeouts: reject ----------------------------------------------------------------------
def test_expired_request_fails_with_deadline_exceeded_and_never_runs(req):
    # binary fractions, so "now == deadline" is exact; no replica frees up in time
    q = batcher(max_batch_size=4, max_queue_delay_s=1.0,
                default_queue_policy=QueuePolicy(default_timeout_s=0.125))
    q.submit(req("a"), now=0.0)
    q.submit(req("b"), now=0.0625)
    assert q.next_batch(now=0.0625, free_replicas=0) is None
    assert q.deadline() == 0.125
    assert q.next_batch(now=0.125, free_replicas=0) is None
    assert failed_ids(q) == ["a"]
    assert q.take_failures() == []  # each failure is reported once
    assert q.deadline() == 0.1875
    assert q.next_batch(now=0.1874, free_replicas=0) is None
    assert failed_ids(q) == []
    assert q.next_batch(now=0.1875, free_replicas=1) is None  # expiring at `now` is expired
    assert failed_ids(q) == ["b"]
    assert q.queued_requests == 0 and q.deadline() is None


def test_expiry_is_checked_before_a_batch_is_formed(req):
    q = batcher(max_batch_size=4, max_queue_delay_s=0.2)
    q.submit(req("a", timeout_s=0.1), now=0.0)
    q.submit(req("b"), now=0.15)
    # a's delay ran out, but so did its timeout: it fails, and b has waited only 0.05 s
    assert q.next_batch(now=0.2, free_replicas=1) is None
    assert failed_ids(q) == ["a"]
    assert q.next_batch(now=0.36, free_replicas=1).ids == ["b"]


def test_request_may_lower_its_timeout(req):
    q = batcher(max_batch_size=4, max_queue_delay_s=1.0,
                default_queue_policy=QueuePolicy(default_timeout_s=0.5))
    q.submit(req("short", timeout_s=0.1), now=0.0)
    q.submit(req("long", timeout_s=5.0), now=0.0)  # may not raise it
    q.next_batch(now=0.1, free_replicas=0)
    assert failed_ids(q) == ["short"]
    q.next_batch(now=0.499, free_replicas=0)
    assert failed_ids(q) == []
    q.next_batch(now=0.5, free_replicas=0)
    assert failed_ids(q) == ["long"]


def test_request_timeout_counts_when_the_level_has_none(req):
    q = batcher(max_batch_size=4, max_queue_delay_s=1.0)
    q.submit(req("a", timeout_s=0.1), now=0.0)
    q.next_batch(now=0.1, free_replicas=0)
    assert failed_ids(q) == ["a"]


def test_request_timeout_is_ignored_without_override(req):
    q = batcher(max_batch_size=4, max_queue_delay_s=1.0, default_queue_policy=QueuePolicy(
        default_timeout_s=0.5, allow_timeout_override=False))
    q.submit(req("a", timeout_s=0.1), now=0.0)
    q.next_batch(now=0.2, free_replicas=0)
    assert failed_ids(q) == []
    q.next_batch(now=0.5, free_replicas=0)
    assert failed_ids(q) == ["a"]


def test_request_timeout_is_ignored_without_override_even_with_no_default(req):
    q = batcher(max_batch_size=4, max_queue_delay_s=1.0,
                default_queue_policy=QueuePolicy(allow_timeout_override=False))
    q.submit(req("a", timeout_s=0.1), now=0.0)
    assert q.next_batch(now=1.0, free_replicas=1).ids == ["a"]
    assert failed_ids(q) == []


def test_non_positive_request_timeout_is_an_invalid_request(req):
    q = batcher()
    with pytest.raises(InvalidRequest, match="timeout_s=0"):
        q.submit(req("a", timeout_s=0), now=0.0)
    assert q.queued_requests == 0


def test_timeout_policy_is_per_level(req):
    q = batcher(max_batch_size=4, max_queue_delay_s=1.0, priority_levels=2,
                priority_queue_policy={2: QueuePolicy(default_timeout_s=0.1)})
    q.submit(req("hi", priority=1), now=0.0)
    q.submit(req("lo", priority=2), now=0.0)
    q.next_batch(now=0.1, free_replicas=0)
    assert failed_ids(q) == ["lo"]
    assert q.next_batch(now=1.0, free_replicas=1).ids == ["hi"]


def test_expired_remainder_of_a_split_request_fails_and_is_not_sent(req):
    q = batcher(max_batch_size=2, max_queue_delay_s=0.0,
                default_queue_policy=QueuePolicy(default_timeout_s=0.1))
    q.submit(req("a", 4), now=0.0)
    assert q.next_batch(now=0.0, free_replicas=1).parts == (Part("a", 0, 2),)
    assert q.next_batch(now=0.1, free_replicas=1) is None
    assert failed_ids(q) == ["a"]
    assert q.queued_items == 0


# -- timeouts: delay -----------------------------------------------------------------------
def delaying(**kw) -> DynamicBatcher:
    delay = QueuePolicy(default_timeout_s=0.1, timeout_action=TimeoutAction.DELAY)
    return batcher(default_queue_policy=delay, **kw)


def test_delayed_request_is_served_after_every_unexpired_request_of_its_level(req):
    q = delaying(max_batch_size=1, max_queue_delay_s=0.0)
    q.submit(req("old"), now=0.0)
    q.submit(req("new1"), now=0.05)
    q.submit(req("new2"), now=0.06)
    assert q.next_batch(now=0.1, free_replicas=1).ids == ["new1"]  # "old" expired at 0.1
    assert failed_ids(q) == []
    assert q.next_batch(now=0.12, free_replicas=1).ids == ["new2"]
    assert q.next_batch(now=0.12, free_replicas=1).ids == ["old"]


def test_delayed_requests_keep_their_expiry_order(req):
    q = delaying(max_batch_size=1, max_queue_delay_s=0.0)
    q.submit(req("a"), now=0.0)
    q.submit(req("b"), now=0.01)
    q.submit(req("c"), now=0.2)
    order = [q.next_batch(now=0.2, free_replicas=1).ids[0] for _ in range(3)]
    assert order == ["c", "a", "b"]


def test_delayed_request_still_goes_before_lower_levels(req):
    q = batcher(max_batch_size=1, max_queue_delay_s=0.0, priority_levels=2,
                priority_queue_policy={1: QueuePolicy(
                    default_timeout_s=0.1, timeout_action=TimeoutAction.DELAY)})
    q.submit(req("hi", priority=1), now=0.0)
    q.submit(req("lo", priority=2), now=0.0)
    q.next_batch(now=0.0, free_replicas=0)
    assert q.next_batch(now=0.5, free_replicas=1).ids == ["hi"]
    assert q.next_batch(now=0.5, free_replicas=1).ids == ["lo"]


def test_delayed_request_counts_toward_the_queue_size_and_can_be_cancelled(req):
    q = batcher(max_batch_size=4, max_queue_delay_s=1.0, default_queue_policy=QueuePolicy(
        max_queue_size=1, default_timeout_s=0.1, timeout_action=TimeoutAction.DELAY))
    q.submit(req("a"), now=0.0)
    q.next_batch(now=0.2, free_replicas=0)
    with pytest.raises(QueueFull):
        q.submit(req("b"), now=0.2)
    assert q.cancel("a", now=0.2) is True
    q.submit(req("b"), now=0.2)
    assert q.next_batch(now=1.2, free_replicas=1).ids == ["b"]


def test_deadline_skips_already_delayed_requests(req):
    q = delaying(max_batch_size=4, max_queue_delay_s=10.0)
    q.submit(req("a"), now=0.0)
    q.next_batch(now=0.1, free_replicas=0)
    assert q.deadline() is None  # "a" already moved behind; its expiry is no reason to wake


# -- per-request deadlines: earliest deadline first ----------------------------------------
def test_within_a_level_earliest_deadline_first(req):
    q = batcher(max_batch_size=1, max_queue_delay_s=0.0)
    q.submit(req("none"), now=0.0)
    q.submit(req("late", timeout_s=0.9), now=0.0)
    q.submit(req("soon", timeout_s=0.5), now=0.1)  # arrived last, due first
    q.submit(req("none2"), now=0.1)
    order = [q.next_batch(now=0.2, free_replicas=1).ids[0] for _ in range(4)]
    assert order == ["soon", "late", "none", "none2"]


def test_deadline_order_does_not_cross_levels(req):
    q = batcher(max_batch_size=1, max_queue_delay_s=0.0, priority_levels=2)
    q.submit(req("lo-urgent", priority=2, timeout_s=0.1), now=0.0)
    q.submit(req("hi", priority=1), now=0.0)
    assert q.next_batch(now=0.0, free_replicas=1).ids == ["hi"]
