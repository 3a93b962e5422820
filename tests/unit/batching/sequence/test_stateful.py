"""StateStore keeps per-sequence state around a StatefulTransformer; make_batch_input."""

from __future__ import annotations

import numpy as np
import pytest

from batching import BatchSizeMismatch, ItemFailed, SequenceLost
from batching.sequence.batcher import SequenceBatch
from batching.sequence.stateful import (
    SequenceBatchInput,
    StatefulTransformer,
    StateStore,
    make_batch_input,
)
from batching.types import FlushReason


class Log(StatefulTransformer):
    """State: the tuple of the sequence's inputs; output: that tuple. Records each call."""

    def __init__(self) -> None:
        self.calls: list[tuple[list, SequenceBatchInput]] = []
        self.fail = False

    def initial_state(self):
        return ()

    def transform(self, inputs, states, controls):
        self.calls.append((list(states), controls))
        if self.fail:
            raise RuntimeError("model exploded")
        new = [None if s is None else (*s, x) for s, x in zip(states, inputs)]
        return new, new


def controls(items, sids, start=None, end=None, ready=None) -> SequenceBatchInput:
    n = len(sids)
    return SequenceBatchInput(items, tuple(sids), tuple(start or [False] * n),
                              tuple(end or [False] * n), tuple(ready or [True] * n))


def test_state_starts_at_initial_state_advances_per_row_and_is_dropped_at_end():
    model = Log()
    store = StateStore(model)
    assert store.run(controls(["a", "x"], [1, 2], start=[True, True])) == [("a",), ("x",)]
    assert store.run(controls(["b", "y"], [1, 2], end=[False, True])) == [("a", "b"), ("x", "y")]
    assert store.live == 1 and 1 in store and 2 not in store
    assert store.run(controls(["new"], [1], start=[True])) == [("new",)]  # a start resets


def test_a_row_that_is_not_ready_is_shown_with_state_none_and_changes_nothing():
    model = Log()
    store = StateStore(model)
    store.run(controls(["a", "x"], [1, 2], start=[True, True]))
    out = store.run(controls(["b", 0], [1, None], ready=[True, False]))
    assert out == [("a", "b"), None]
    states, seen = model.calls[-1]
    assert states == [("a",), None] and seen.ready == (True, False)
    assert store.run(controls(["y"], [2])) == [("x", "y")]  # 2 untouched by the not-ready row


def test_a_sequence_without_state_here_fails_alone_with_sequence_lost():
    model = Log()
    store = StateStore(model)
    store.run(controls(["a"], [1], start=[True]))
    out = store.run(controls(["b", "q"], [1, 99]))
    assert out[0] == ("a", "b")
    assert isinstance(out[1], ItemFailed) and isinstance(out[1].error, SequenceLost)
    assert "sequence 99 has no state on this replica" in str(out[1].error)
    assert model.calls[-1][1].ready == (True, False)  # the model never sees it as ready
    assert 99 not in store


def test_a_model_error_changes_no_state_at_all():
    model = Log()
    store = StateStore(model)
    store.run(controls(["a", "x"], [1, 2], start=[True, True]))
    model.fail = True
    with pytest.raises(RuntimeError, match="model exploded"):
        store.run(controls(["b", "y", "n"], [1, 2, 3], start=[False, False, True],
                           end=[False, True, False]))
    model.fail = False
    assert store.live == 2 and 3 not in store
    assert store.run(controls(["c", "z"], [1, 2])) == [("a", "c"), ("x", "z")]


def test_a_wrong_number_of_outputs_fails_the_batch():
    class Short(Log):
        def transform(self, inputs, states, controls):
            return [1], [1]

    with pytest.raises(BatchSizeMismatch, match="returned 1 outputs and 1 states for a batch "
                                                "of 2 rows"):
        StateStore(Short()).run(controls(["a", "b"], [1, 2], start=[True, True]))


def test_release_drops_states_and_counts_those_that_were_here():
    store = StateStore(Log())
    store.run(controls(["a", "b"], [1, "two"], start=[True, True]))
    assert store.release([1, 5]) == 1 and store.live == 1
    assert store.release(["two"]) == 1 and store.live == 0


def test_the_base_class_says_what_to_implement():
    with pytest.raises(NotImplementedError, match="must implement transform"):
        StatefulTransformer().transform([], [], controls([], []))


def batch(request_ids, ready=None) -> SequenceBatch:
    n = len(request_ids)
    ready = tuple(ready or [rid is not None for rid in request_ids])
    sids = tuple(None if rid is None else f"s{rid}" for rid in request_ids)
    return SequenceBatch(0, "A", tuple(request_ids), sids, (False,) * n, (False,) * n, ready,
                         tuple(range(n)), FlushReason.FULL, 0.0)


def test_make_batch_input_stacks_array_items_with_zeros_where_not_ready():
    items = {1: np.array([5], np.int32), 3: np.array([7], np.int32)}
    inp = make_batch_input(batch([1, None, 3]), items)
    assert isinstance(inp.items, np.ndarray) and inp.items.dtype == np.int32
    assert inp.items.tolist() == [[5], [0], [7]]
    assert (inp.sequence_ids, inp.ready, inp.rows) == (("s1", None, "s3"), (True, False, True), 3)


def test_make_batch_input_keeps_a_list_when_items_are_not_arrays_of_one_shape():
    assert make_batch_input(batch([1, None]), {1: "text"}).items == ["text", None]
    mixed = make_batch_input(batch([1, 2]), {1: np.zeros(2), 2: np.zeros(3)})
    assert isinstance(mixed.items, list) and len(mixed.items) == 2
    assert make_batch_input(batch([1]), {1: None}).items == [None]  # a None item is an item
