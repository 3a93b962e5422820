"""Multi-tensor and ragged models through the handle and RaybatchClient: every request gets
its own rows of every output (checked against the model run alone), ragged items are padded
per batch without leaking into anyone's result, and only arrays of the declared tensors are
accepted."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

from batching.errors import InvalidRequest
from batching.model import run_batch
from batching.tensors import TensorBatch
from deployments.ingress.client import RaybatchClient
from deployments.models import TwoTower
from tests.conftest import arun

pytestmark = pytest.mark.integration


@pytest.fixture(scope="module")
def local():
    model = TwoTower()
    model.setup("cpu")
    return lambda q, d: run_batch(model, TensorBatch({"query": q, "doc": d}))


def pairs(n: int, seed: int):
    rng = np.random.default_rng(seed)
    return [(rng.standard_normal((1 + i % 3, 16)).astype(np.float32),
             rng.standard_normal((1 + i % 3, 16)).astype(np.float32)) for i in range(n)]


def test_the_handle_returns_every_output_of_a_two_input_model(app, local):
    (q, d), = pairs(1, seed=1)
    out = app.handle.infer.remote("twotower", {"query": q, "doc": d}).result(timeout_s=60)
    want = local(q, d)
    assert list(out) == ["score", "embedding", "label"]
    np.testing.assert_allclose(out["score"], want["score"], rtol=1e-5)
    np.testing.assert_allclose(out["embedding"], want["embedding"], rtol=1e-5, atol=1e-6)
    assert out["label"].tolist() == want["label"].tolist()


def test_200_concurrent_callers_each_get_their_own_rows_of_every_output(app, local):
    inputs = pairs(200, seed=2)

    async def main():
        client = RaybatchClient(app.handle)
        return await asyncio.gather(*(client.infer("twotower", {"query": q, "doc": d})
                                      for q, d in inputs))

    before = app.stats("twotower")["batches"]
    outs = arun(main())
    for (q, d), out in zip(inputs, outs, strict=True):
        want = local(q, d)
        np.testing.assert_allclose(out["score"], want["score"], rtol=1e-4, atol=1e-6)
        assert out["label"].tolist() == want["label"].tolist()
        assert out["embedding"].shape == (len(q), 8)
    assert app.stats("twotower")["batches"] - before < 200  # they were batched together


def test_ragged_items_are_padded_per_batch_and_each_result_is_its_own(app):
    rng = np.random.default_rng(3)
    requests = []
    for i in range(120):
        length = int(rng.choice([2, 3, 40, 41]))
        ids = rng.integers(0, 100, size=(1 + i % 2, length))
        requests.append((ids, np.full(len(ids), 0.5 + i % 3, np.float32)))

    async def main():
        client = RaybatchClient(app.handle)
        return await asyncio.gather(*(client.infer("ragged", {"ids": ids, "weight": w})
                                      for ids, w in requests))

    outs = arun(main())
    for (ids, w), out in zip(requests, outs, strict=True):
        assert out["length"].tolist() == [ids.shape[1]] * len(ids)
        np.testing.assert_allclose(out["total"], ids.sum(axis=1) * w, rtol=1e-6)
        assert (out["padded_to"] >= ids.shape[1]).all()


@pytest.mark.parametrize("inputs, says", [
    ({"query": np.zeros((1, 16)), "doc": np.zeros((1, 16), np.float32)},
     "inference input 'query' data-type is 'FP64', but model 'twotower' expects 'FP32'"),
    ({"query": [[0.0] * 16], "doc": np.zeros((1, 16), np.float32)},
     "input 'query' must be a numpy array of FP32, got list"),
    ({"query": np.array([[object()] * 16]), "doc": np.zeros((1, 16), np.float32)},
     "objects are only accepted for BYTES"),
    ({"query": np.zeros((1, 16), np.float32)}, "missing ['doc']"),
])
def test_only_arrays_of_the_declared_tensors_get_through(app, inputs, says):
    with pytest.raises(InvalidRequest) as e:
        app.handle.infer.remote("twotower", inputs).result(timeout_s=30)
    assert says in str(e.value)
