"""`deployments.wire.bundles`: a bundle of same-shaped arrays goes as one stacked array and
comes back the same way; anything else goes as the list it was. Each side reads both."""

from __future__ import annotations

import pickle

import numpy as np

from batching.errors import QueueFull
from deployments.wire.bundles import (
    Entry,
    Outcome,
    Stacked,
    StackedOutcomes,
    entries,
    outcomes,
    pack,
    pack_outcomes,
)


def rows(n: int, value: float, width: int = 4) -> np.ndarray:
    return np.full((n, width), value, np.float32)


def test_same_shaped_arrays_are_stacked_and_unpacked_as_views_in_order():
    bundle = [Entry(0, rows(1, 1.0), None, None), Entry(1, rows(3, 2.0), 2, 1000.5),
              Entry(2, rows(2, 3.0), None, 1001.0)]
    packed = pack(bundle)
    assert type(packed) is Stacked and packed.items.shape == (6, 4)
    back = pickle.loads(pickle.dumps(packed, protocol=5))
    got = list(entries(back))
    # each entry keeps its own deadline, the very instant it was given
    assert [(e.key, e.priority, e.deadline) for e in got] == [(0, None, None), (1, 2, 1000.5),
                                                               (2, None, 1001.0)]
    assert all(e.control is None and e.requests == 1 for e in got)
    for (_, want, *_), (_, have, *_) in zip(bundle, got):
        np.testing.assert_array_equal(have, want)
        assert have.base is not None  # a view of the one array


def test_anything_else_goes_as_the_list_it_was():
    controls = [Entry(0, rows(1, 1.0), control=("s", True, False)),
                Entry(1, rows(1, 2.0), control=("s", False, True))]
    mixed_dtype = [Entry(0, rows(1, 1.0)), Entry(1, rows(1, 1.0).astype(np.float64))]
    mixed_rows = [Entry(0, rows(1, 1.0, 4)), Entry(1, rows(1, 1.0, 5))]
    lists = [Entry(0, [1.0]), Entry(1, [2.0])]
    one = [Entry(0, rows(2, 1.0))]
    # a block of the native front's carries its count of requests: it must reach the actor
    block = [Entry(0, rows(3, 1.0), requests=3), Entry(1, rows(1, 2.0))]
    for bundle in (controls, mixed_dtype, mixed_rows, lists, one, block):
        assert pack(bundle) is bundle
        assert list(entries(bundle)) == bundle


def test_a_stacked_bundle_is_answered_stacked_with_errors_beside_the_values():
    bundle = pack([Entry(k, rows(k + 1, float(k))) for k in range(3)])
    refused = QueueFull("full")
    answer = pack_outcomes(bundle, [Outcome(1, None, refused), Outcome(0, rows(1, 0.5)),
                                    Outcome(2, rows(3, 2.5))])
    assert type(answer) is StackedOutcomes and answer.values.shape == (4, 4)
    got = {k: (v, e) for k, v, e in outcomes(pickle.loads(pickle.dumps(answer)))}
    assert got[1][0] is None and isinstance(got[1][1], QueueFull)
    np.testing.assert_array_equal(got[0][0], rows(1, 0.5))
    np.testing.assert_array_equal(got[2][0], rows(3, 2.5))


def test_answers_that_cannot_be_stacked_go_as_a_list():
    stacked = pack([Entry(k, rows(1, 1.0)) for k in range(2)])
    for out in ([Outcome(0, rows(1, 1.0)), Outcome(1, {"a": rows(1, 1.0)})],  # a dict value
                [Outcome(0, rows(1, 1.0)), Outcome(1, rows(1, 1.0, 5))],  # rows differ
                [Outcome(0, None, QueueFull("x")), Outcome(1, None, QueueFull("y"))]):  # none
        assert pack_outcomes(stacked, out) is out
        assert list(outcomes(out)) == out
    plain = [Entry(0, rows(1, 1.0)), Entry(1, rows(1, 1.0))]
    answer = [Outcome(0, rows(1, 1.0)), Outcome(1, rows(1, 1.0))]
    assert pack_outcomes(plain, answer) is answer  # a list bundle gets a list answer


def test_a_stacked_bundle_whose_counts_do_not_add_up_is_refused_not_misread():
    import numpy as np
    import pytest

    from batching.errors import InvalidRequest
    from deployments.wire.bundles import Stacked, entries

    bad = Stacked([1, 2], np.zeros((3, 2), np.float32), [1, 1], [None, None], [None, None])
    with pytest.raises(InvalidRequest, match="adding up to 2 for 3 rows"):
        list(entries(bad))
    short = Stacked([1, 2], np.zeros((2, 2), np.float32), [2], [None, None], [None, None])
    with pytest.raises(InvalidRequest):
        list(entries(short))


def test_a_zero_dimensional_item_keeps_the_bundle_a_list():
    import numpy as np

    from deployments.wire.bundles import pack

    bundle = [Entry(1, np.zeros(3, np.float32)), Entry(2, np.ones((), np.float32))]
    assert pack(bundle) is bundle


def test_an_entry_off_the_wire_is_checked_once_by_entries():
    import pytest

    from batching.errors import InvalidRequest

    listed = [(0, rows(1, 1.0), 2, None), Entry(1, rows(1, 2.0), 3, 1000.5, requests=4)]
    got = list(entries(listed))
    assert [type(e) for e in got] == [Entry, Entry]
    assert (got[0].key, got[0].priority, got[0].deadline, got[0].requests) == (0, 2, None, 1)
    assert (got[1].deadline, got[1].requests) == (1000.5, 4)
    for bad in ([(0,)], [{"key": 0}], [(0, 1, 2, 3, 4, 5, 6)], "not a list"):
        with pytest.raises(InvalidRequest, match="entr"):
            list(entries(bad))


def test_a_plain_tuple_with_a_time_in_it_is_refused_not_read_as_an_instant():
    """A caller of before the deadline sent `(key, items, priority, timeout_s)` tuples, of
    the same length: a timeout of 0.5 s read as an instant would be long past. A plain
    tuple may carry no time; an `Entry` names its deadline."""
    import pytest

    from batching.errors import InvalidRequest

    for old in ((0, rows(1, 1.0), None, 0.5), (0, rows(1, 1.0), 2, 30.0, None, 1)):
        with pytest.raises(InvalidRequest, match=r"deadline.*not a timeout.*Entry\(") as e:
            list(entries([old]))
        assert repr(old[3]) in str(e.value)
    assert list(entries([(0, [1.0], None, None, None, 2)])) == [Entry(0, [1.0], requests=2)]


def test_an_answer_is_read_as_outcomes_whatever_its_form():
    """Outcomes read by name: a list of them, plain tuples from a foreign sender, or the
    stacked form, each comes back as `Outcome`s in entry order."""
    from batching.errors import QueueFull

    err = QueueFull("full")
    listed = [Outcome("a", np.ones((1, 2))), Outcome("b", None, err)]
    assert [o.key for o in outcomes(listed)] == ["a", "b"]
    assert all(type(o) is Outcome for o in outcomes([("a", 1, None), ("b", None, err)]))
    bundle = pack([Entry("a", np.ones((1, 2))), Entry("b", np.ones((2, 2)))])
    packed = pack_outcomes(bundle, [Outcome("a", np.zeros((1, 2))), Outcome("b", None, err)])
    assert type(packed) is StackedOutcomes
    [a, b] = outcomes(packed)
    assert a.key == "a" and a.value.shape == (1, 2) and a.error is None
    assert b == Outcome("b", None, err)
