"""Per-item cost with max_batch_cost, and requests split across batches and joined again."""

from __future__ import annotations

import numpy as np
import pytest

from batching import (
    Batch,
    DynamicBatcher,
    DynamicPolicy,
    FlushReason,
    InvalidRequest,
    Ledger,
    Part,
    Request,
)


def batcher(**kw) -> DynamicBatcher:
    return DynamicBatcher(DynamicPolicy(**kw))


def run(batch: Batch, requests: dict, fn=lambda x: x * 10) -> list:
    """A fake model: one result per item, derived from the item, in batch order."""
    out = []
    for part in batch.parts:
        out.extend(fn(x) for x in requests[part.request_id].items[part.start : part.stop])
    return out


# -- cost ----------------------------------------------------------------------------------
def test_cost_fn_limits_the_batch_by_cost_not_count(req):
    q = batcher(max_batch_size=100, max_batch_cost=10, cost_fn=len, max_queue_delay_s=1.0)
    q.submit(req("a", items=["xxxx"]), now=0.0)  # cost 4
    q.submit(req("b", items=["xxxx"]), now=0.0)  # cost 8 in all
    assert q.next_batch(now=0.0, free_replicas=1) is None
    q.submit(req("c", items=["xxx"]), now=0.0)  # cost 11 >= 10: full
    b = q.next_batch(now=0.0, free_replicas=1)
    assert (b.ids, b.cost, b.reason) == (["a", "b"], 8.0, FlushReason.FULL)
    assert q.next_batch(now=1.0, free_replicas=1).ids == ["c"]


def test_batch_stops_at_the_first_item_that_does_not_fit(req):
    # "b" does not fit after "a"; "c" would, but must not jump the queue ahead of "b"
    q = batcher(max_batch_size=100, max_batch_cost=10, cost_fn=lambda x: x, max_queue_delay_s=0)
    q.submit(req("a", items=[6]), now=0.0)
    q.submit(req("b", items=[5]), now=0.0)
    q.submit(req("c", items=[1]), now=0.0)
    assert q.next_batch(now=0.0, free_replicas=1).ids == ["a"]
    assert q.next_batch(now=0.0, free_replicas=1).ids == ["b", "c"]


def test_request_is_split_where_its_items_stop_fitting_the_cost(req):
    q = batcher(max_batch_size=100, max_batch_cost=10, cost_fn=lambda x: x, max_queue_delay_s=0)
    q.submit(req("a", items=[3, 3, 3, 3, 3]), now=0.0)
    b1 = q.next_batch(now=0.0, free_replicas=1)
    b2 = q.next_batch(now=0.0, free_replicas=1)
    assert (b1.parts, b1.cost, b1.num_items) == ((Part("a", 0, 3),), 9.0, 3)
    assert (b2.parts, b2.cost) == ((Part("a", 3, 5),), 6.0)


def test_max_batch_cost_without_cost_fn_counts_items(req):
    q = batcher(max_batch_size=100, max_batch_cost=3, max_queue_delay_s=0)
    q.submit(req("a", 5), now=0.0)
    assert q.next_batch(now=0.0, free_replicas=1).parts == (Part("a", 0, 3),)


def test_zero_cost_items_are_bounded_by_max_batch_size(req):
    q = batcher(max_batch_size=3, max_batch_cost=1, cost_fn=lambda x: 0, max_queue_delay_s=0)
    q.submit(req("a", 5), now=0.0)
    b = q.next_batch(now=0.0, free_replicas=1)
    assert (b.parts, b.cost) == ((Part("a", 0, 3),), 0.0)


@pytest.mark.parametrize("cost", [11, -1, float("nan")])
def test_an_item_costing_more_than_a_batch_may_is_rejected_up_front(req, cost):
    q = batcher(max_batch_size=8, max_batch_cost=10, cost_fn=lambda x: x)
    with pytest.raises(InvalidRequest, match=r"item 1 of request 'a' costs .*max_batch_cost=10"):
        q.submit(req("a", items=[1, cost]), now=0.0)
    assert q.queued_requests == 0 and q.queued_items == 0


# -- split by max_batch_size ---------------------------------------------------------------
def test_request_larger_than_a_batch_is_split_in_item_order(req):
    q = batcher(max_batch_size=4, max_queue_delay_s=0.0)
    q.submit(req("a", 10), now=0.0)
    parts = [q.next_batch(now=0.0, free_replicas=1).parts for _ in range(3)]
    assert parts == [(Part("a", 0, 4),), (Part("a", 4, 8),), (Part("a", 8, 10),)]
    assert q.next_batch(now=0.0, free_replicas=1) is None


def test_remainder_of_a_split_request_stays_at_the_head(req):
    q = batcher(max_batch_size=4, max_queue_delay_s=0.0)
    q.submit(req("a", 3), now=0.0)
    q.submit(req("b", 3), now=0.0)
    q.submit(req("c", 1), now=0.0)
    assert q.next_batch(now=0.0, free_replicas=1).parts == (Part("a", 0, 3), Part("b", 0, 1))
    assert q.next_batch(now=0.0, free_replicas=1).parts == (Part("b", 1, 3), Part("c", 0, 1))


def test_remainder_of_a_split_request_does_not_restart_the_delay(req):
    q = batcher(max_batch_size=2, max_queue_delay_s=0.010)
    q.submit(req("a", 3), now=0.0)
    q.next_batch(now=0.0, free_replicas=1)
    assert q.deadline() == pytest.approx(0.010)
    assert q.next_batch(now=0.010, free_replicas=1).parts == (Part("a", 2, 3),)


# -- split, run, join ----------------------------------------------------------------------
def test_split_list_request_is_joined_in_order_whatever_order_parts_finish(req):
    q = batcher(max_batch_size=3, max_queue_delay_s=0.0)
    led = Ledger()
    a = req("a", items=[1, 2, 3, 4, 5, 6, 7])
    b = req("b", items=[8, 9])
    reqs = {r.id: r for r in (a, b)}
    for r in (a, b):
        led.open(r)
        q.submit(r, now=0.0)
    batches = []
    while (bt := q.next_batch(now=0.0, free_replicas=1)) is not None:
        batches.append(bt)
    assert [bt.parts for bt in batches] == [
        (Part("a", 0, 3),), (Part("a", 3, 6),), (Part("a", 6, 7), Part("b", 0, 2))]
    outcomes = []
    for bt in reversed(batches):
        outcomes += led.deliver(bt, run(bt, reqs))
    assert [(o.request_id, o.value, o.error) for o in outcomes] == [
        ("b", [80, 90], None), ("a", [10, 20, 30, 40, 50, 60, 70], None)]
    assert len(led) == 0


def test_split_ndarray_request_is_joined_into_one_array(req):
    q = batcher(max_batch_size=4, max_batch_cost=20, cost_fn=lambda row: float(row.sum()),
                max_queue_delay_s=0.0)
    led = Ledger()
    x = np.arange(12, dtype=np.float64).reshape(6, 2)
    x[5] = [0.0, 1.0]  # row costs 1, 5, 9, 13, 17, 1
    a = Request("a", x)
    led.open(a)
    q.submit(a, now=0.0)
    batches = []
    while (bt := q.next_batch(now=0.0, free_replicas=1)) is not None:
        batches.append(bt)
    assert [(bt.parts, bt.cost) for bt in batches] == [
        ((Part("a", 0, 3),), 15.0), ((Part("a", 3, 4),), 13.0), ((Part("a", 4, 6),), 18.0)]
    results = {bt.id: x[bt.parts[0].start : bt.parts[0].stop] * 2 for bt in batches}
    got = []
    for bt in [batches[1], batches[2], batches[0]]:
        got += led.deliver(bt, results[bt.id])
    (outcome,) = got
    assert isinstance(outcome.value, np.ndarray)
    np.testing.assert_array_equal(outcome.value, x * 2)


def test_single_item_request_gets_its_item_not_a_list(req):
    q = batcher(max_batch_size=4, max_queue_delay_s=0.0)
    led = Ledger()
    reqs = {"s": req("s", items=[7], single=True), "m": req("m", items=[7])}
    for r in reqs.values():
        led.open(r)
        q.submit(r, now=0.0)
    bt = q.next_batch(now=0.0, free_replicas=1)
    got = {o.request_id: o.value for o in led.deliver(bt, run(bt, reqs))}
    assert got == {"s": 70, "m": [70]}


def test_cancelled_split_request_never_sends_its_remainder_and_drops_late_parts(req):
    from batching import Cancelled

    q = batcher(max_batch_size=2, max_queue_delay_s=0.0)
    led = Ledger()
    reqs = {"a": req("a", items=[1, 2, 3, 4, 5]), "b": req("b", items=[6])}
    for r in reqs.values():
        led.open(r)
        q.submit(r, now=0.0)
    first = q.next_batch(now=0.0, free_replicas=1)
    assert first.parts == (Part("a", 0, 2),)
    assert q.cancel("a", now=0.0) is True
    assert [o.error.__class__ for o in led.fail("a", Cancelled("a"))] == [Cancelled]
    second = q.next_batch(now=0.0, free_replicas=1)
    assert second.parts == (Part("b", 0, 1),)
    assert q.next_batch(now=0.0, free_replicas=1) is None
    assert led.deliver(first, run(first, reqs)) == []  # late part of a cancelled request
    assert [(o.request_id, o.value) for o in led.deliver(second, run(second, reqs))] == [
        ("b", [60])]


def test_cancel_and_expiry_give_their_queued_cost_back(req):
    from batching import QueuePolicy

    q = batcher(max_batch_size=100, max_batch_cost=10, cost_fn=lambda x: x, max_queue_delay_s=1.0,
                default_queue_policy=QueuePolicy(default_timeout_s=5.0))
    q.submit(req("a", items=[4, 4]), now=0.0)
    q.cancel("a", now=0.0)
    q.submit(req("b", items=[4], timeout_s=0.25), now=0.0)
    q.next_batch(now=0.25, free_replicas=0)  # "b" expires
    q.submit(req("c", items=[4, 4]), now=0.25)  # 8 < 10: not full once a and b are gone
    assert q.next_batch(now=0.25, free_replicas=1) is None
    q.submit(req("d", items=[2]), now=0.25)
    assert q.next_batch(now=0.25, free_replicas=1).reason is FlushReason.FULL
