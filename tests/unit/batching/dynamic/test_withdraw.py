"""Withdrawing some items of a queued request (`batching.dynamic.withdraw`): in the
batcher alone (what is still queued loses them; what is in a batch keeps running; its
queue's counts stay right), and through the host on a fake clock (the model sees only the
rows left, the answer says which rows it carries, each client's request counted once).
Hostile rows are refused with InvalidRequest; an unknown request is a no-op."""

from __future__ import annotations

import numpy as np
import pytest

from batching import Cancelled, DynamicBatcher, DynamicPolicy
from batching.errors import InvalidRequest
from batching.types import Part, Request, Rows
from tests.conftest import arun as run
from tests.unit.batching.dynamic.test_host import Clock, FakeReplica, make_host, spin


def batcher(max_batch_size=4, **policy) -> DynamicBatcher:
    return DynamicBatcher(DynamicPolicy(max_batch_size=max_batch_size,
                                        max_queue_delay_s=1.0, **policy))


def level_counts(q: DynamicBatcher) -> tuple[int, int]:
    depth = q.queued_by_level()[0]
    return depth.requests, depth.items


# -- the batcher -------------------------------------------------------------------------
def test_rows_of_a_whole_queued_request_are_withdrawn_and_the_rest_batched_in_order():
    q = batcher(max_batch_size=8)
    q.submit(Request("a", tuple(range(8)), requests=4), now=0.0)
    cut = q.cancel_rows("a", [6, 2, 3, 2], now=0.0)  # unsorted, with a duplicate
    assert cut.rows.tolist() == [2, 3, 6] and cut.items == 3 and cut.cost == 3.0
    assert list(cut.request.items) == [0, 1, 4, 5, 7] and cut.request.num_items == 5
    assert q.queued_items == 5 and q.queued_requests == 1 and level_counts(q) == (1, 5)
    batch = q.next_batch(now=1.0, free_replicas=1)
    assert batch.parts == (Part("a", 0, 5),) and batch.num_items == 5 and batch.cost == 5.0
    assert q.queued_items == 0 and q.queued_requests == 0 and level_counts(q) == (0, 0)


def test_only_the_rows_not_yet_in_a_batch_are_withdrawn():
    q = batcher(max_batch_size=4)
    q.submit(Request("a", tuple(range(8))), now=0.0)
    first = q.next_batch(now=0.0, free_replicas=1)
    assert first.parts == (Part("a", 0, 4),) and q.queued_items == 4
    cut = q.cancel_rows("a", [1, 5, 6], now=0.0)  # 1 is in the batch: it runs
    assert cut.rows.tolist() == [5, 6] and list(cut.request.items) == [0, 1, 2, 3, 4, 7]
    assert q.queued_items == 2 and level_counts(q) == (1, 2)
    second = q.next_batch(now=1.0, free_replicas=1)
    assert second.parts == (Part("a", 4, 6),)  # positions now: the items 4 and 7
    assert q.queued_requests == 0 and q.deadline() is None


def test_a_request_wholly_in_batches_has_nothing_to_withdraw():
    q = batcher(max_batch_size=4)
    q.submit(Request("a", tuple(range(4))), now=0.0)
    q.next_batch(now=0.0, free_replicas=1)
    assert q.cancel_rows("a", [0, 3], now=0.0) is None
    assert q.queued_items == 0 and q.queued_requests == 0


def test_withdrawing_every_queued_row_of_a_split_request_leaves_nothing_queued():
    q = batcher(max_batch_size=3)
    q.submit(Request("a", tuple(range(5))), now=0.0)
    q.submit(Request("b", (10,)), now=0.0)
    q.next_batch(now=0.0, free_replicas=1)  # a[0:3]
    cut = q.cancel_rows("a", [3, 4], now=0.0)
    assert cut.request.num_items == 3 and cut.items == 2
    assert q.queued_requests == 1 and q.queued_items == 1 and level_counts(q) == (1, 1)
    assert q.next_batch(now=1.0, free_replicas=1).parts == (Part("b", 0, 1),)
    assert q.queued_requests == 0 and q.queued_items == 0


def test_costs_follow_the_rows_withdrawn():
    q = batcher(max_batch_size=8, max_batch_cost=100.0, cost_fn=float)
    q.submit(Request("a", (1, 2, 3, 4)), now=0.0)
    cut = q.cancel_rows("a", [1, 3], now=0.0)
    assert cut.cost == 6.0 and list(cut.request.items) == [1, 3]
    assert q._cost == pytest.approx(4.0)
    assert q.next_batch(now=1.0, free_replicas=1).cost == pytest.approx(4.0)
    assert q._cost == pytest.approx(0.0) and q.queued_items == 0


def test_array_and_named_items_are_compacted_along_their_rows():
    from batching.tensors import TensorBatch

    q = batcher(max_batch_size=8)
    q.submit(Request("a", np.arange(12).reshape(6, 2)), now=0.0)
    q.submit(Request("t", TensorBatch({"x": np.arange(4), "y": np.arange(4) * 10})), now=0.0)
    assert q.cancel_rows("a", [0, 5], now=0.0).request.items.tolist() == [
        [2, 3], [4, 5], [6, 7], [8, 9]]
    tb = q.cancel_rows("t", [1], now=0.0).request.items
    assert tb["x"].tolist() == [0, 2, 3] and tb["y"].tolist() == [0, 20, 30]
    assert q.queued_items == 7


@pytest.mark.parametrize("rows", [[8], [-1], [0, 99], [1.5], [[1, 2]], "12", [True], None,
                                  object()])
def test_rows_that_are_not_the_requests_items_are_refused_and_nothing_changes(rows):
    q = batcher()
    q.submit(Request("a", tuple(range(8))), now=0.0)
    with pytest.raises(InvalidRequest):
        q.cancel_rows("a", rows, now=0.0)
    assert q.queued_items == 8 and level_counts(q) == (1, 8)


def test_an_unknown_request_or_no_rows_withdraw_nothing():
    q = batcher()
    q.submit(Request("a", (1, 2)), now=0.0)
    assert q.cancel_rows("nope", [0], now=0.0) is None
    assert q.cancel_rows("a", [], now=0.0) is None
    assert q.queued_items == 2


# -- the host ----------------------------------------------------------------------------
def block(rid, n_clients=4, per=2, **kw) -> Request:
    """A block: `n_clients` requests of `per` items each, items 0.. in order."""
    return Request(rid, tuple(range(n_clients * per)), requests=n_clients, **kw)


def test_a_partly_dispatched_block_runs_only_the_rows_left_and_says_which_it_answers():
    async def main():
        a = FakeReplica("a")
        host, _ = make_host(a, max_batch_size=4, max_inflight=1)
        fut = host.submit(block("b"))
        await spin()
        assert a.pending() == [[0, 1, 2, 3]]
        # clients 1 and 3 leave: rows 2, 3 are running; 6, 7 are withdrawn
        assert host.cancel_rows("b", [2, 3, 6, 7]) == 2
        assert host.stats()["queued_items"] == 2 and host.outcomes == {"cancelled": 1}
        a.finish()
        await spin()
        assert a.pending() == [[4, 5]]
        a.finish()
        await spin()
        value, rows = fut.result()
        assert rows.tolist() == [0, 1, 2, 3, 4, 5]
        assert value == [f"a:{x * x}" for x in rows.tolist()]
        assert host.outcomes == {"cancelled": 1, "ok": 3} and host.open_requests == 0
        stats = host.stats()
        assert stats["success"]["count"] == 3 and stats["fail"]["count"] == 1
    run(main())


def test_a_block_queued_behind_a_busy_replica_runs_only_its_clients_left():
    async def main():
        a = FakeReplica("a")
        host, _ = make_host(a, max_batch_size=8, max_inflight=1)
        busy = host.submit(Request("busy", (100,)))
        await spin()
        fut = host.submit(block("b", n_clients=4, per=2))
        await spin()
        assert host.cancel_rows("b", [0, 1, 4, 5]) == 4  # clients 0 and 2 left
        assert host.outcomes == {"cancelled": 2}
        a.finish()
        await spin()
        assert a.pending() == [[2, 3, 6, 7]]  # what the model sees: the clients left
        a.finish()
        await spin()
        assert busy.result() == ["a:10000"]
        assert fut.result() == Rows(["a:4", "a:9", "a:36", "a:49"], fut.result().rows)
        assert fut.result().rows.tolist() == [2, 3, 6, 7]
        assert host.outcomes == {"cancelled": 2, "ok": 3}  # busy, and the block's two
    run(main())


def test_rows_already_sent_are_not_withdrawn_and_the_answer_is_whole():
    async def main():
        a = FakeReplica("a")
        host, _ = make_host(a, max_batch_size=4, max_inflight=1)
        fut = host.submit(block("b"))
        await spin()
        a.finish()  # rows 0-3 back; 4-7 go out next...
        other = host.submit(Request("x", (9,)))
        await spin()
        assert a.pending() == [[4, 5, 6, 7]]  # ... and do: nothing of b is queued
        assert host.cancel_rows("b", [4, 5, 6, 7]) == 0  # the fallback: they run
        a.finish()
        await spin()
        assert fut.result() == [f"a:{x * x}" for x in range(8)]  # not Rows: all of it
        a.finish()
        await spin()
        assert other.result() == ["a:81"]

    run(main())


def test_withdrawing_the_rows_still_queued_of_a_request_otherwise_back_ends_it_now():
    async def main():
        a = FakeReplica("a")
        host, _ = make_host(a, max_batch_size=4, max_inflight=1, priority_levels=2)
        fut = host.submit(block("c"))  # level 2, the default
        await spin()
        blocker = host.submit(Request("y", (3, 3, 3, 3), priority=1))
        a.finish()  # c[0:4] back; y (level 1) runs next, c[4:8] waits behind it
        await spin()
        assert a.pending() == [[3, 3, 3, 3]] and not fut.done()
        assert host.cancel_rows("c", [4, 5, 6, 7]) == 4
        assert fut.done() and fut.result() == Rows(["a:0", "a:1", "a:4", "a:9"],
                                                   fut.result().rows)
        assert fut.result().rows.tolist() == [0, 1, 2, 3]
        assert host.outcomes == {"cancelled": 2, "ok": 2}
        a.finish()
        await spin()
        assert blocker.result() == ["a:9"] * 4 and a.pending() == []
    run(main())


def test_withdrawing_every_row_it_still_has_cancels_it():
    async def main():
        a = FakeReplica("a")
        host, _ = make_host(a, max_batch_size=4, max_inflight=1)
        fut = host.submit(block("b"))
        await spin()
        assert host.cancel_rows("b", [6, 7]) == 2
        assert host.cancel_rows("b", range(8)) == 6  # 0-3 in flight, 4-5 queued: all
        await spin()
        with pytest.raises(Cancelled):
            fut.result()
        assert host.outcomes == {"cancelled": 4} and host.stats()["queued_items"] == 0
        a.finish()
        await spin()
        assert host.open_requests == 0
    run(main())


def test_array_rows_map_back_by_index():
    class Squares(FakeReplica):
        async def run(self, items):
            return items * items, 0.001

    async def main():
        host, _ = make_host(Squares("s"), max_batch_size=16, max_inflight=1,
                            clock=Clock())
        blocker = host.submit(Request("x", np.array([[1.0, 1.0]])))
        x = np.arange(16, dtype=np.float32).reshape(8, 2)
        fut = host.submit(Request("b", x, requests=8))
        assert host.cancel_rows("b", [1, 4, 5]) == 3
        await spin()
        value, rows = fut.result()
        assert blocker.done() and rows.tolist() == [0, 2, 3, 6, 7]
        np.testing.assert_array_equal(value, x[rows] ** 2)
    run(main())


def test_hostile_rows_at_the_host_are_refused_and_an_unknown_id_is_a_no_op():
    async def main():
        a = FakeReplica("a")
        host, _ = make_host(a, max_batch_size=8, max_inflight=1)
        host.submit(Request("busy", (1,)))
        await spin()
        fut = host.submit(block("b"))
        for rows in ([8], [-1], ["x"], [[0]]):
            with pytest.raises(InvalidRequest):
                host.cancel_rows("b", rows)
        assert host.cancel_rows("nope", [0]) == 0
        assert host.cancel_rows("b", [3, 3, 3]) == 1
        assert host.cancel_rows("b", [3]) == 0  # withdrawn before: nothing more
        assert host.stats()["queued_items"] == 7
        a.finish()
        await spin()
        a.finish()
        await spin()
        assert fut.result().rows.tolist() == [0, 1, 2, 4, 5, 6, 7]
        assert host.outcomes == {"ok": 5}  # client 1 keeps row 2: nobody lost every row
    run(main())


def test_a_host_that_aborts_forgets_what_it_withdrew():
    async def main():
        a = FakeReplica("a")
        host, _ = make_host(a, max_batch_size=8, max_inflight=1)
        host.submit(Request("busy", (1,)))
        await spin()
        fut = host.submit(block("b"))
        assert host.cancel_rows("b", [0, 1]) == 2 and "b" in host._held
        host.abort(RuntimeError("closing"))
        await spin()
        assert isinstance(fut.exception(), RuntimeError) and host._held == {}
    run(main())
