"""DynamicBatcher: when a batch leaves, what it holds, and what the host is told."""

from __future__ import annotations

import pytest

from batching import DynamicBatcher, DynamicPolicy, FlushReason, InvalidRequest, Part


def batcher(**kw) -> DynamicBatcher:
    return DynamicBatcher(DynamicPolicy(**kw))


# -- max_batch_size and max_queue_delay_s --------------------------------------------------
def test_waits_for_the_delay_then_sends_what_is_queued(req):
    q = batcher(max_batch_size=4, max_queue_delay_s=0.010)
    q.submit(req("a"), now=0.000)
    q.submit(req("b"), now=0.004)
    assert q.next_batch(now=0.009, free_replicas=1) is None
    b = q.next_batch(now=0.010, free_replicas=1)
    assert (b.ids, b.num_items, b.reason) == (["a", "b"], 2, FlushReason.DELAY)
    assert q.queued_requests == 0 and q.deadline() is None


def test_the_delay_counts_from_the_oldest_request(req):
    q = batcher(max_batch_size=8, max_queue_delay_s=0.010)
    q.submit(req("a"), now=0.000)
    q.submit(req("b"), now=0.009)
    assert q.next_batch(now=0.010, free_replicas=1).ids == ["a", "b"]


def test_full_batch_leaves_at_once_and_the_rest_keeps_waiting(req):
    q = batcher(max_batch_size=2, max_queue_delay_s=1.0)
    for i, rid in enumerate("abc"):
        q.submit(req(rid), now=0.001 * i)
    b = q.next_batch(now=0.002, free_replicas=1)
    assert (b.ids, b.reason) == (["a", "b"], FlushReason.FULL)
    assert q.next_batch(now=0.5, free_replicas=1) is None
    assert q.next_batch(now=1.002, free_replicas=1).ids == ["c"]


def test_full_counts_items_not_requests(req):
    q = batcher(max_batch_size=4, max_queue_delay_s=1.0)
    q.submit(req("a", 3), now=0.0)
    assert q.next_batch(now=0.0, free_replicas=1) is None
    q.submit(req("b", 1), now=0.0)
    b = q.next_batch(now=0.0, free_replicas=1)
    assert (b.num_items, b.reason) == (4, FlushReason.FULL)
    assert b.parts == (Part("a", 0, 3), Part("b", 0, 1))


def test_zero_delay_gives_an_idle_replica_whatever_is_queued_at_once(req):
    q = batcher(max_batch_size=8, max_queue_delay_s=0.0)
    q.submit(req("a"), now=1.0)
    q.submit(req("b", 2), now=1.0)
    b = q.next_batch(now=1.0, free_replicas=1)
    assert (b.ids, b.num_items) == (["a", "b"], 3)


def test_zero_delay_still_needs_a_free_replica(req):
    q = batcher(max_batch_size=8, max_queue_delay_s=0.0)
    q.submit(req("a"), now=1.0)
    assert q.next_batch(now=1.0, free_replicas=0) is None
    q.submit(req("b"), now=1.5)
    assert q.next_batch(now=2.0, free_replicas=1).ids == ["a", "b"]


def test_no_batch_without_a_free_replica_even_when_full(req):
    q = batcher(max_batch_size=1, max_queue_delay_s=0.0)
    q.submit(req("a"), now=0.0)
    assert q.next_batch(now=0.0, free_replicas=0) is None
    assert q.next_batch(now=0.0, free_replicas=1).ids == ["a"]


def test_nothing_queued_gives_none(req):
    q = batcher(max_batch_size=4, max_queue_delay_s=0.0)
    assert q.next_batch(now=0.0, free_replicas=3) is None


# -- preferred_batch_sizes -----------------------------------------------------------------
def test_sends_as_soon_as_the_largest_preferred_size_is_queued(req):
    q = batcher(max_batch_size=8, max_queue_delay_s=1.0, preferred_batch_sizes=(2, 4))
    for i in range(3):
        q.submit(req(i), now=0.0)
        assert q.next_batch(now=0.0, free_replicas=1) is None  # 2 is preferred but not largest
    q.submit(req(3), now=0.0)
    b = q.next_batch(now=0.0, free_replicas=1)
    assert (b.ids, b.reason) == ([0, 1, 2, 3], FlushReason.PREFERRED)


def test_preferred_batch_takes_the_preferred_size_not_everything(req):
    q = batcher(max_batch_size=8, max_queue_delay_s=1.0, preferred_batch_sizes=(4,))
    q.submit(req("a", 3), now=0.0)
    q.submit(req("b", 3), now=0.0)
    b = q.next_batch(now=0.0, free_replicas=1)
    assert (b.parts, b.reason) == ((Part("a", 0, 3), Part("b", 0, 1)), FlushReason.PREFERRED)
    assert q.queued_items == 2


def test_on_delay_sends_the_largest_preferred_size_that_fits(req):
    q = batcher(max_batch_size=8, max_queue_delay_s=0.010, preferred_batch_sizes=(2, 4, 6))
    for i in range(5):
        q.submit(req(i), now=0.0)
    b = q.next_batch(now=0.010, free_replicas=1)
    assert (b.ids, b.reason) == ([0, 1, 2, 3], FlushReason.DELAY)
    assert q.next_batch(now=0.010, free_replicas=1).ids == [4]  # 4 waited too; none fits


def test_on_delay_sends_everything_when_no_preferred_size_fits(req):
    q = batcher(max_batch_size=8, max_queue_delay_s=0.010, preferred_batch_sizes=(4,))
    for i in range(3):
        q.submit(req(i), now=0.0)
    b = q.next_batch(now=0.010, free_replicas=1)
    assert (b.ids, b.reason) == ([0, 1, 2], FlushReason.DELAY)


def test_full_wins_over_preferred(req):
    q = batcher(max_batch_size=4, max_queue_delay_s=1.0, preferred_batch_sizes=(4,))
    for i in range(4):
        q.submit(req(i), now=0.0)
    assert q.next_batch(now=0.0, free_replicas=1).reason is FlushReason.FULL


# -- drain ---------------------------------------------------------------------------------
def test_drain_sends_everything_without_waiting(req):
    q = batcher(max_batch_size=2, max_queue_delay_s=10.0)
    for rid in "abc":
        q.submit(req(rid), now=0.0)
    assert q.next_batch(now=0.0, free_replicas=1).reason is FlushReason.FULL
    q.drain()
    b = q.next_batch(now=0.001, free_replicas=1)
    assert (b.ids, b.reason) == (["c"], FlushReason.DRAIN)
    assert q.next_batch(now=0.001, free_replicas=1) is None


def test_drain_still_respects_max_batch_size(req):
    q = batcher(max_batch_size=2, max_queue_delay_s=10.0)
    q.submit(req("a", 3), now=0.0)
    q.drain()
    assert q.next_batch(now=0.0, free_replicas=1).parts == (Part("a", 0, 2),)
    assert q.next_batch(now=0.0, free_replicas=1).parts == (Part("a", 2, 3),)


# -- deadline() ----------------------------------------------------------------------------
def test_deadline_is_none_when_nothing_is_queued(req):
    q = batcher(max_batch_size=4, max_queue_delay_s=0.010)
    assert q.deadline() is None
    q.submit(req("a"), now=0.0)
    q.next_batch(now=0.010, free_replicas=1)
    assert q.deadline() is None


def test_deadline_is_the_delay_time(req):
    q = batcher(max_batch_size=4, max_queue_delay_s=0.010)
    q.submit(req("a"), now=0.002)
    assert q.deadline() == pytest.approx(0.012)
    q.submit(req("b"), now=0.005)
    assert q.deadline() == pytest.approx(0.012)  # still the oldest request's


def test_deadline_while_no_replica_is_free_is_only_the_expiry_time(req):
    from batching import QueuePolicy

    q = batcher(max_batch_size=4, max_queue_delay_s=0.010,
                default_queue_policy=QueuePolicy(default_timeout_s=0.5))
    q.submit(req("a"), now=0.0)
    assert q.deadline() == pytest.approx(0.010)
    assert q.next_batch(now=0.010, free_replicas=0) is None
    assert q.deadline() == pytest.approx(0.5)  # nothing to do before a replica frees or it expires
    assert q.next_batch(now=0.2, free_replicas=1).ids == ["a"]


def test_deadline_while_blocked_without_timeouts_is_none(req):
    q = batcher(max_batch_size=4, max_queue_delay_s=0.010)
    q.submit(req("a"), now=0.0)
    assert q.next_batch(now=0.010, free_replicas=0) is None
    assert q.deadline() is None  # only a completion (a free replica) can change anything


def test_deadline_after_a_free_replica_is_seen_again(req):
    q = batcher(max_batch_size=4, max_queue_delay_s=0.010)
    q.submit(req("a"), now=0.0)
    q.submit(req("b"), now=0.1)
    q.next_batch(now=0.001, free_replicas=0)
    assert q.next_batch(now=0.001, free_replicas=1) is None
    assert q.deadline() == pytest.approx(0.010)


# -- cancel --------------------------------------------------------------------------------
def test_cancelled_request_never_reaches_a_batch(req):
    q = batcher(max_batch_size=4, max_queue_delay_s=0.010)
    q.submit(req("a"), now=0.0)
    q.submit(req("b"), now=0.0)
    assert q.cancel("a", now=0.001) is True
    assert q.cancel("a", now=0.001) is False
    assert q.cancel("nope", now=0.001) is False
    assert (q.queued_requests, q.queued_items) == (1, 1)
    assert q.next_batch(now=0.010, free_replicas=1).ids == ["b"]
    assert q.take_failures() == []


def test_cancelling_the_oldest_moves_the_delay_to_the_next(req):
    q = batcher(max_batch_size=4, max_queue_delay_s=0.010)
    q.submit(req("a"), now=0.0)
    q.submit(req("b"), now=0.005)
    q.cancel("a", now=0.006)
    assert q.deadline() == pytest.approx(0.015)
    assert q.next_batch(now=0.010, free_replicas=1) is None


def test_cancelling_everything_leaves_nothing_to_do(req):
    q = batcher(max_batch_size=4, max_queue_delay_s=0.010)
    q.submit(req("a", 3), now=0.0)
    q.cancel("a", now=0.0)
    assert q.deadline() is None
    assert q.next_batch(now=1.0, free_replicas=1) is None


def test_remainder_of_a_partly_dispatched_request_is_cancelled(req):
    q = batcher(max_batch_size=2, max_queue_delay_s=0.0)
    q.submit(req("a", 5), now=0.0)
    q.submit(req("b"), now=0.0)
    assert q.next_batch(now=0.0, free_replicas=1).parts == (Part("a", 0, 2),)
    assert q.cancel("a", now=0.0) is True
    assert q.next_batch(now=0.0, free_replicas=1).parts == (Part("b", 0, 1),)
    assert q.queued_items == 0 and q.next_batch(now=0.0, free_replicas=1) is None


def test_cancel_of_a_fully_dispatched_request_withdraws_nothing(req):
    q = batcher(max_batch_size=2, max_queue_delay_s=0.0)
    q.submit(req("a"), now=0.0)
    q.next_batch(now=0.0, free_replicas=1)
    assert q.cancel("a", now=0.0) is False


# -- submit validation, ids, complete, stats -----------------------------------------------
def test_submit_rejects_an_empty_request_and_keeps_nothing(req):
    q = batcher()
    with pytest.raises(InvalidRequest, match="no items"):
        q.submit(req("a", 0), now=0.0)
    assert q.queued_requests == 0


def test_submit_rejects_a_duplicate_queued_id(req):
    q = batcher(max_queue_delay_s=1.0)
    q.submit(req("a"), now=0.0)
    with pytest.raises(InvalidRequest, match="already queued"):
        q.submit(req("a", 2), now=0.0)
    assert q.queued_items == 1


def test_an_id_may_be_reused_once_its_request_left_the_queue(req):
    q = batcher(max_queue_delay_s=0.0)
    q.submit(req("a"), now=0.0)
    q.next_batch(now=0.0, free_replicas=1)
    q.submit(req("a"), now=0.1)
    assert q.next_batch(now=0.1, free_replicas=1).ids == ["a"]


def test_complete_returns_the_batch_once(req):
    q = batcher(max_queue_delay_s=0.0)
    q.submit(req("a"), now=0.0)
    b = q.next_batch(now=0.0, free_replicas=1)
    assert q.inflight_batches == 1
    assert q.complete(b.id, now=0.01) is b
    assert q.inflight_batches == 0
    with pytest.raises(KeyError, match="not in flight"):
        q.complete(b.id, now=0.02)


def test_batch_ids_are_unique_and_created_at_now(req):
    q = batcher(max_batch_size=1, max_queue_delay_s=0.0)
    q.submit(req("a"), now=0.0)
    q.submit(req("b"), now=0.0)
    b1 = q.next_batch(now=0.5, free_replicas=2)
    b2 = q.next_batch(now=0.7, free_replicas=1)
    assert b1.id != b2.id
    assert (b1.created_s, b2.created_s) == (0.5, 0.7)


def test_stats_count_batches_by_size_and_reason(req):
    q = batcher(max_batch_size=2, max_queue_delay_s=0.010)
    for rid in "abc":
        q.submit(req(rid), now=0.0)
    q.next_batch(now=0.0, free_replicas=1)
    q.next_batch(now=0.010, free_replicas=1)
    d = q.stats.as_dict()
    assert (d["batches"], d["items"], d["mean_batch_size"]) == (2, 3, 1.5)
    assert (d["by_size"], d["by_reason"]) == ({1: 1, 2: 1}, {"full": 1, "delay": 1})
