"""Ledger: results matched by id and offsets, one outcome per request, ordered release."""

from __future__ import annotations

import numpy as np
import pytest

from batching import (
    Batch,
    BatchSizeMismatch,
    Cancelled,
    DeadlineExceeded,
    FlushReason,
    ItemFailed,
    Ledger,
    ModelError,
    Outcome,
    Part,
    ServiceClosed,
)


def batch(bid: int, *parts: tuple) -> Batch:
    ps = tuple(Part(*p) for p in parts)
    n = sum(p.num_items for p in ps)
    return Batch(bid, ps, n, float(n), FlushReason.FULL, 0.0)


def opened(req, *specs, preserve_ordering=False) -> Ledger:
    """A ledger with requests open: each spec is (id, num_items) or (id, 1, 'single')."""
    led = Ledger(preserve_ordering=preserve_ordering)
    for rid, n, *single in specs:
        led.open(req(rid, n, single=bool(single)))
    return led


def summary(outcomes: list[Outcome]) -> list[tuple]:
    return [(o.request_id, o.value if o.error is None else type(o.error)) for o in outcomes]


def test_results_are_cut_along_parts_by_id(req):
    led = opened(req, ("a", 2), ("b", 1, "single"), ("c", 3))
    out = led.deliver(batch(0, ("c", 0, 3), ("a", 0, 2), ("b", 0, 1)), [1, 2, 3, 4, 5, 6])
    assert summary(out) == [("c", [1, 2, 3]), ("a", [4, 5]), ("b", 6)]
    assert len(led) == 0


def test_ndarray_results_stay_arrays(req):
    led = opened(req, ("a", 2), ("b", 1, "single"))
    res = np.arange(6).reshape(3, 2)
    got = {o.request_id: o.value for o in led.deliver(batch(0, ("a", 0, 2), ("b", 0, 1)), res)}
    np.testing.assert_array_equal(got["a"], [[0, 1], [2, 3]])
    np.testing.assert_array_equal(got["b"], [4, 5])


def test_parts_delivered_out_of_order_are_joined_in_item_order(req):
    led = opened(req, ("a", 5))
    assert led.deliver(batch(2, ("a", 4, 5)), ["e"]) == []
    assert "a" in led
    assert led.deliver(batch(0, ("a", 0, 2)), ["a", "b"]) == []
    assert summary(led.deliver(batch(1, ("a", 2, 4)), ["c", "d"])) == [
        ("a", ["a", "b", "c", "d", "e"])]
    assert "a" not in led


def test_ndarray_parts_out_of_order_are_concatenated(req):
    led = opened(req, ("a", 4))
    assert led.deliver(batch(1, ("a", 3, 4)), np.array([[3.0, 3.0]])) == []
    (o,) = led.deliver(batch(0, ("a", 0, 3)), np.array([[0.0, 0], [1, 1], [2, 2]]))
    np.testing.assert_array_equal(o.value, [[0, 0], [1, 1], [2, 2], [3, 3]])


def test_result_count_mismatch_fails_that_batch_only(req):
    led = opened(req, ("a", 2), ("b", 1), ("c", 1))
    out = led.deliver(batch(0, ("a", 0, 2), ("b", 0, 1)), [1, 2])
    assert summary(out) == [("a", BatchSizeMismatch), ("b", BatchSizeMismatch)]
    assert "3 items" in str(out[0].error) and "2 results" in str(out[0].error)
    assert summary(led.deliver(batch(1, ("c", 0, 1)), [9])) == [("c", [9])]


def test_result_count_mismatch_fails_a_split_request_and_drops_its_other_parts(req):
    led = opened(req, ("a", 4))
    assert summary(led.deliver(batch(0, ("a", 0, 2)), [1, 2, 3])) == [("a", BatchSizeMismatch)]
    assert led.deliver(batch(1, ("a", 2, 4)), [3, 4]) == []
    assert len(led) == 0


def test_item_failed_fails_only_its_request(req):
    led = opened(req, ("a", 2), ("b", 1), ("c", 2))
    boom = ValueError("bad item")
    out = led.deliver(batch(0, ("a", 0, 2), ("b", 0, 1), ("c", 0, 2)),
                      [1, ItemFailed(boom), 3, 4, 5])
    assert summary(out) == [("a", ValueError), ("b", [3]), ("c", [4, 5])]
    assert out[0].error is boom


def test_item_failed_in_an_object_array(req):
    led = opened(req, ("a", 1), ("b", 1))
    res = np.empty(2, dtype=object)
    res[0], res[1] = ItemFailed(KeyError("x")), 7
    assert summary(led.deliver(batch(0, ("a", 0, 1), ("b", 0, 1)), res)) == [
        ("a", KeyError), ("b", [7])]


def test_late_part_of_a_failed_split_request_is_dropped(req):
    led = opened(req, ("a", 4), ("b", 1))
    first = led.deliver(batch(0, ("a", 0, 2)), [ItemFailed(ValueError()), 2])
    assert summary(first) == [("a", ValueError)]
    assert summary(led.deliver(batch(1, ("a", 2, 4), ("b", 0, 1)), [3, 4, 5])) == [("b", [5])]


def test_late_part_of_a_cancelled_request_is_dropped(req):
    led = opened(req, ("a", 2))
    assert summary(led.fail("a", Cancelled("gone"))) == [("a", Cancelled)]
    assert led.fail("a", Cancelled("again")) == []
    assert led.deliver(batch(0, ("a", 0, 2)), [1, 2]) == []


def test_a_request_ends_once_even_when_a_part_is_delivered_twice(req):
    led = opened(req, ("a", 4))
    part = batch(0, ("a", 0, 2))
    assert led.deliver(part, [1, 2]) == []
    assert led.deliver(part, [1, 2]) == []  # a retried batch must not complete "a" with 2 of 4
    assert summary(led.deliver(batch(1, ("a", 2, 4)), [3, 4])) == [("a", [1, 2, 3, 4])]


def test_fail_batch_fails_only_requests_still_open(req):
    led = opened(req, ("a", 1), ("b", 1))
    led.deliver(batch(0, ("a", 0, 1)), [1])
    b = batch(1, ("a", 0, 1), ("b", 0, 1))
    assert summary(led.fail_batch(b, ModelError("x"))) == [("b", ModelError)]


def test_fail_all_ends_every_open_request(req):
    led = opened(req, ("a", 1), ("b", 2))
    assert summary(led.fail_all(ServiceClosed("bye"))) == [
        ("a", ServiceClosed), ("b", ServiceClosed)]
    assert len(led) == 0 and led.fail_all(ServiceClosed("bye")) == []


def test_unknown_ids_are_ignored(req):
    led = opened(req, ("a", 1))
    assert led.fail("zz", ValueError()) == []
    assert summary(led.deliver(batch(0, ("zz", 0, 1), ("a", 0, 1)), [0, 1])) == [("a", [1])]


def test_open_refuses_a_duplicate_id(req):
    led = opened(req, ("a", 1))
    with pytest.raises(ValueError, match="already open"):
        led.open(req("a"))


# -- preserve_ordering ---------------------------------------------------------------------
def test_preserve_ordering_releases_in_arrival_order(req):
    led = opened(req, ("a", 1), ("b", 1), ("c", 1), preserve_ordering=True)
    assert led.deliver(batch(2, ("c", 0, 1)), ["C"]) == []
    assert led.deliver(batch(1, ("b", 0, 1)), ["B"]) == []
    assert summary(led.deliver(batch(0, ("a", 0, 1)), ["A"])) == [
        ("a", ["A"]), ("b", ["B"]), ("c", ["C"])]


def test_preserve_ordering_holds_failures_too(req):
    led = opened(req, ("a", 1), ("b", 1), ("c", 1), preserve_ordering=True)
    assert led.fail("b", DeadlineExceeded("late")) == []  # waits for "a"
    assert led.deliver(batch(1, ("c", 0, 1)), [3]) == []
    assert summary(led.deliver(batch(0, ("a", 0, 1)), [1])) == [
        ("a", [1]), ("b", DeadlineExceeded), ("c", [3])]


def test_preserve_ordering_a_failed_head_releases_the_finished_rest(req):
    led = opened(req, ("a", 1), ("b", 1), preserve_ordering=True)
    assert led.deliver(batch(1, ("b", 0, 1)), [2]) == []
    assert "b" not in led  # ended, though not yet released
    assert summary(led.fail("a", Cancelled())) == [("a", Cancelled), ("b", [2])]
    assert len(led) == 0


def test_without_preserve_ordering_outcomes_leave_as_soon_as_they_end(req):
    led = opened(req, ("a", 1), ("b", 1))
    assert summary(led.deliver(batch(1, ("b", 0, 1)), [2])) == [("b", [2])]
