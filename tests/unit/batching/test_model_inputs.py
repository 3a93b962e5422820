"""A model's inputs are its own and writable (`batching.model.writable`), whatever the batch
is made of: one request's read-only view of the bytes it came in, several requests
concatenated, named inputs, a list of rows. (Over the direct connection to a replica,
where pickle keeps a sender's read-only array read-only: `tests/unit/deployments/
test_codec.py`.)"""

from __future__ import annotations

import numpy as np
import pytest

from batching.model import VectorTransformer, run_batch, writable


class Doubler(VectorTransformer):
    """Writes to its inputs in place, as a model may: each array times 2."""

    def __init__(self) -> None:
        self.seen: list[object] = []

    def transform(self, pre):
        self.seen.append(pre)
        if isinstance(pre, dict):
            for x in pre.values():
                for part in x if isinstance(x, list) else [x]:
                    part *= 2
            return pre
        if isinstance(pre, list):
            for x in pre:
                x *= 2
            return pre
        pre *= 2
        return pre


def received(values, dtype=np.float32) -> np.ndarray:
    """An array as a request brings it: a read-only view of the bytes that came in."""
    return np.frombuffer(np.asarray(values, dtype).tobytes(), dtype)


def test_a_read_only_batch_is_copied_and_the_bytes_it_came_in_are_left_alone():
    x = received([1, 2, 3]).reshape(3, 1)
    assert not x.flags.writeable
    out = run_batch(Doubler(), x)
    assert np.asarray(out).ravel().tolist() == [2.0, 4.0, 6.0]
    assert x.ravel().tolist() == [1.0, 2.0, 3.0]


def test_a_writable_batch_goes_to_the_model_as_it_is_without_a_copy():
    x = np.arange(4, dtype=np.float32)
    model = Doubler()
    run_batch(model, x)
    assert model.seen[0] is x and x.tolist() == [0.0, 2.0, 4.0, 6.0]


@pytest.mark.parametrize("make", [
    lambda: {"a": received([1, 2]), "b": np.array([3.0, 4.0], np.float32)},
    lambda: [received([1, 2]), np.array([3.0], np.float32), received([5])],
])
def test_named_inputs_and_rows_that_are_read_only_are_copied_the_others_kept(make):
    items = make()
    model = Doubler()
    run_batch(model, items)
    seen = model.seen[0]
    values = list(seen.values()) if isinstance(seen, dict) else seen
    originals = list(items.values()) if isinstance(items, dict) else items
    assert all(v.flags.writeable for v in values)
    for got, original in zip(values, originals):
        assert (got is original) == original.flags.writeable  # only read-only ones copied


def test_the_rows_of_a_ragged_named_input_handed_as_a_list_are_writable():
    items = {"tokens": [received([1, 2]), received([3])], "b": np.array([3.0], np.float32)}
    got = writable(items)
    assert all(r.flags.writeable for r in got["tokens"]) and got["b"] is items["b"]
    assert [r.tolist() for r in got["tokens"]] == [[1.0, 2.0], [3.0]]


def test_other_items_pass_unchanged():
    items = [b"a", "b", 3]
    assert writable(items) is items
    named = {"a": np.ones(2), "rows": [np.ones(1)]}
    assert writable(named) is named
    assert writable(np.array([b"x"], object)).tolist() == [b"x"]
