"""TensorBatch, Collate and the ledger with named tensors: every request gets its own rows
of every output, by item offsets, however its items were split and padded."""

from __future__ import annotations

import numpy as np
import pytest

from batching import BatchSizeMismatch, InvalidRequest, Ledger
from batching.model import VectorTransformer, run_batch
from batching.tensors import Collate, Ragged, TensorBatch, join_items, length_of, pad_concat
from batching.types import Batch, FlushReason, Part, Request


def tb(n: int, start: int = 0) -> TensorBatch:
    rows = np.arange(start, start + n)
    return TensorBatch({"q": rows.astype(np.float32), "d": np.stack([rows, -rows], 1)})


def test_a_tensor_batch_slices_and_joins_every_tensor_at_once():
    batch = tb(5)
    assert len(batch) == 5 and batch.names == ("q", "d")
    part = batch[1:3]
    assert part["q"].tolist() == [1, 2] and part["d"].tolist() == [[1, -1], [2, -2]]
    item = batch[4]
    assert item["q"] == 4.0 and item["d"].tolist() == [4, -4]
    joined = TensorBatch.concatenate([batch[3:], batch[:3]])
    assert joined["q"].tolist() == [3, 4, 0, 1, 2]
    assert [item["q"] for item in joined][:2] == [3.0, 4.0]


def test_tensors_that_disagree_on_the_batch_size_are_refused_naming_them():
    with pytest.raises(BatchSizeMismatch, match=r"\{'a': 2, 'b': 3\}"):
        TensorBatch({"a": np.zeros(2), "b": np.zeros(3)})
    with pytest.raises(BatchSizeMismatch, match="same names"):
        TensorBatch.concatenate([tb(1), TensorBatch({"q": np.zeros(1)})])


def test_the_ledger_gives_each_request_its_rows_of_every_output_across_split_batches():
    led = Ledger()
    led.open(Request("a", tb(3), num_items=3))
    led.open(Request("b", tb(2, 10), num_items=2))
    first = Batch(0, (Part("a", 0, 2),), 2, 2.0, FlushReason.FULL, 0.0)
    second = Batch(1, (Part("b", 0, 2), Part("a", 2, 3)), 3, 3.0, FlushReason.FULL, 0.0)
    # The second batch comes back first; outputs are the model's, rows in batch order.
    out = led.deliver(second, TensorBatch({"y": np.array([10, 11, 2]),
                                            "z": np.array(["b0", "b1", "a2"], object)}))
    assert [o.request_id for o in out] == ["b"]
    assert out[0].value["y"].tolist() == [10, 11] and out[0].value["z"].tolist() == ["b0", "b1"]
    (a,) = led.deliver(first, TensorBatch({"y": np.array([0, 1]),
                                           "z": np.array(["a0", "a1"], object)}))
    assert a.value["y"].tolist() == [0, 1, 2] and a.value["z"].tolist() == ["a0", "a1", "a2"]


def test_a_batch_with_the_wrong_number_of_rows_fails_every_request_in_it():
    led = Ledger()
    led.open(Request("a", tb(2), num_items=2))
    batch = Batch(0, (Part("a", 0, 2),), 2, 2.0, FlushReason.FULL, 0.0)
    (out,) = led.deliver(batch, TensorBatch({"y": np.zeros(3)}))
    assert isinstance(out.error, BatchSizeMismatch)


def test_collate_pads_a_ragged_tensor_to_the_longest_piece_with_its_pad_value():
    c = Collate({"ids": Ragged("pad", axis=1, pad_value=0)})
    short = TensorBatch({"ids": np.array([[1, 2]]), "w": np.array([1.0])})
    long = TensorBatch({"ids": np.array([[3, 4, 5, 6], [7, 8, 9, 10]]),
                        "w": np.array([2.0, 3.0])})
    out = c([short, long])
    assert isinstance(out, TensorBatch)
    assert out["ids"].tolist() == [[1, 2, 0, 0], [3, 4, 5, 6], [7, 8, 9, 10]]
    assert out["w"].tolist() == [1.0, 2.0, 3.0]


def test_collate_pads_any_axis_and_keeps_the_dtype():
    x = pad_concat([np.ones((1, 2, 1), np.int8), np.ones((1, 2, 3), np.int8)], 2, 9)
    assert x.dtype == np.int8 and x.shape == (2, 2, 3)
    assert x[0].tolist() == [[1, 9, 9], [1, 9, 9]]


def test_collate_hands_a_list_tensor_over_as_per_item_arrays():
    c = Collate({"ids": Ragged("list")}, name="ids")
    out = c([np.array([[1, 2]]), np.array([[3, 4, 5]])])
    assert [row.tolist() for row in out] == [[1, 2], [3, 4, 5]]
    multi = Collate({"ids": Ragged("list")})([TensorBatch({"ids": np.array([[1]]),
                                                         "w": np.array([5])}),
                                             TensorBatch({"ids": np.array([[2, 3]]),
                                                          "w": np.array([6])})])
    assert isinstance(multi, dict) and [r.tolist() for r in multi["ids"]] == [[1], [2, 3]]
    assert multi["w"].tolist() == [5, 6]


def test_pieces_of_different_shapes_without_a_ragged_rule_fail_saying_what_to_declare():
    with pytest.raises(InvalidRequest, match=r"tensor 'ids'.*declare it ragged"):
        Collate(name="ids")([np.zeros((1, 2)), np.zeros((1, 3))])
    with pytest.raises(InvalidRequest, match="declare it ragged"):
        join_items([np.zeros((1, 2)), np.zeros((1, 3))])


def test_lengths_for_grouping_come_from_the_ragged_axis_or_the_longest_string():
    assert length_of("ids", 1)(TensorBatch({"ids": np.zeros((2, 7))})) == 7
    assert length_of()(np.zeros((1, 5))) == 5
    assert length_of()(np.array(["ab", "abcdef"], dtype=object)) == 6


class TwoInTwoOut(VectorTransformer):
    def transform(self, batch):
        return {"sum": batch["a"] + batch["b"], "tag": np.array([b"x"] * len(batch["a"]),
                                                                 dtype=object)}


def test_run_batch_hands_the_model_a_dict_and_its_answer_back_as_a_tensor_batch():
    out = run_batch(TwoInTwoOut(), TensorBatch({"a": np.arange(3), "b": np.ones(3)}))
    assert isinstance(out, TensorBatch) and len(out) == 3
    assert out["sum"].tolist() == [1, 2, 3] and out["tag"].tolist() == [b"x"] * 3
