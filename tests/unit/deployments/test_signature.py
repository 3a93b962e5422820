"""Signature: what a request may carry for a model's declared tensors, and what comes back.

Callers never send pickles: only numpy arrays of the declared dtype get through, and
every refusal names the tensor and the fix.
"""

from __future__ import annotations

import numpy as np
import pytest

from batching.errors import InvalidRequest, ModelError
from batching.tensors import TensorBatch
from cluster.config import ModelConfig
from deployments.signature import Signature

SINGLE = ModelConfig(name="sq", transformer="deployments.models:Square",
                     inputs=[{"name": "INPUT0", "datatype": "FP32", "shape": [-1]}],
                     outputs=[{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1]}])
MULTI = ModelConfig(
    name="tt", transformer="deployments.models:TwoTower",
    inputs=[{"name": "query", "datatype": "FP32", "shape": [-1, 4]},
            {"name": "text", "datatype": "BYTES", "shape": [-1]}],
    outputs=[{"name": "score", "datatype": "FP32", "shape": [-1]},
             {"name": "label", "datatype": "BYTES", "shape": [-1]}])


def test_a_single_tensor_model_keeps_taking_one_array():
    x = np.array([1.0, 2.0], np.float32)
    assert Signature(SINGLE).items({"INPUT0": x}) is x
    assert Signature(SINGLE).result([1.0, 4.0])["OUTPUT0"].dtype == np.float32


def test_a_multi_tensor_request_becomes_one_tensor_batch_of_every_input():
    items = Signature(MULTI).items({"query": np.zeros((2, 4), np.float32),
                                    "text": np.array(["a", b"b"], dtype=object)})
    assert isinstance(items, TensorBatch) and len(items) == 2
    assert items["text"].tolist() == [b"a", b"b"]  # str elements are sent as UTF-8 bytes


@pytest.mark.parametrize("inputs, match", [
    ({"query": np.zeros((1, 4), np.float32)}, r"takes inputs \['query', 'text'\].*missing"),
    ({"query": np.zeros((1, 4), np.float64), "text": np.array([b"a"], object)},
     r"inference input 'query' data-type is 'FP64', but model 'tt' expects 'FP32'.*astype"),
    ({"query": [[0.0] * 4], "text": np.array([b"a"], object)},
     r"input 'query' must be a numpy array of FP32, got list"),
    ({"query": np.zeros((1, 5), np.float32), "text": np.array([b"a"], object)},
     r"unexpected shape for input 'query' for model 'tt'. Expected \[-1,4\], got \[1,5\]: "
         r"dim 1 must be 4, not 5"),
    ({"query": np.zeros((2, 4), np.float32), "text": np.array([b"a"], object)},
     r"disagree on the batch size"),
    ({"query": np.zeros((1, 4), np.float32), "text": np.array([{"x": 1}], object)},
     r"input 'text' is BYTES: its elements must be bytes or str, got dict"),
    ({"query": np.zeros((1, 4), np.float32), "text": np.array([1], np.int64)},
     r"input 'text' is declared BYTES, so it must be an object array"),
    ({"query": np.array([[object()] * 4], object), "text": np.array([b"a"], object)},
     r"objects are only accepted for BYTES"),
    ({"query": np.zeros((0, 4), np.float32), "text": np.zeros(0, object)},
     r"empty batch dimension"),
])
def test_anything_but_arrays_of_the_declared_tensors_is_refused_naming_the_tensor(inputs, match):
    with pytest.raises(InvalidRequest, match=match):
        Signature(MULTI).items(inputs)


def test_byte_order_does_not_matter():
    big = np.array([[1, 2, 3, 4]], dtype=">f4")
    items = Signature(MULTI).items({"query": big, "text": np.array([b"a"], object)})
    assert items["query"].dtype == np.dtype("<f4") and items["query"].tolist() == [[1, 2, 3, 4]]


def test_a_result_is_every_declared_output_and_a_missing_one_is_named():
    out = Signature(MULTI).result(TensorBatch({"score": np.array([0.5]),
                                               "label": np.array([b"x"], object),
                                               "extra": np.zeros(1)}))
    assert list(out) == ["score", "label"] and out["score"].dtype == np.float32
    with pytest.raises(ModelError, match=r"did not return outputs \['label'\]"):
        Signature(MULTI).result({"score": np.array([0.5])})


def test_check_answer_says_how_a_model_differs_from_its_declared_outputs():
    sig = Signature(MULTI)
    good = TensorBatch({"score": np.zeros(2, np.float32), "label": np.array([b"a"] * 2, object)})
    sig.check_answer(good, 2)
    with pytest.raises(ModelError, match=r"missing \['label'\].*undeclared \['labels'\]"):
        sig.check_answer(TensorBatch({"score": np.zeros(2), "labels": np.zeros(2)}), 2)
    with pytest.raises(ModelError, match="must return a dict of them"):
        sig.check_answer(np.zeros(2), 2)
    with pytest.raises(ModelError, match=r"output 'score' has shape \[2, 3\].*rank 2 != 1"):
        sig.check_answer(TensorBatch({"score": np.zeros((2, 3)),
                                      "label": np.array([b"a"] * 2, object)}), 2)
    with pytest.raises(ModelError, match=r"output 'label' is float64 but declared BYTES"):
        sig.check_answer(TensorBatch({"score": np.zeros(2), "label": np.zeros(2)}), 2)
    with pytest.raises(ModelError, match="returned 3 rows per output for a batch of 2"):
        sig.check_answer(TensorBatch({"score": np.zeros(3),
                                      "label": np.array([b"a"] * 3, object)}), 2)
    with pytest.raises(ModelError, match="declares one output 'OUTPUT0' but returned a dict"):
        Signature(SINGLE).check_answer(TensorBatch({"OUTPUT0": np.zeros(2)}), 2)
