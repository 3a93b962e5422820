"""TwoTower, the multi-tensor demo: a dict of two inputs in, three outputs out, row by row."""

from __future__ import annotations

import numpy as np

from batching.model import run_batch
from batching.tensors import TensorBatch
from deployments.models import TwoTower


def test_two_inputs_three_outputs_deterministic_and_row_independent():
    a, b = TwoTower(), TwoTower()
    a.setup("cpu")
    b.setup("cpu")
    rng = np.random.default_rng(3)
    q, d = (rng.standard_normal((6, 16)).astype(np.float32) for _ in range(2))
    out = run_batch(a, TensorBatch({"query": q, "doc": d}))
    assert out.names == ("score", "embedding", "label") and len(out) == 6
    assert out["score"].dtype == np.float32 and out["embedding"].shape == (6, 8)
    np.testing.assert_allclose(np.linalg.norm(out["embedding"], axis=1), 1.0, rtol=1e-5)
    assert set(out["label"]) <= {b"relevant", b"irrelevant"}
    assert (out["label"] == b"relevant").tolist() == (out["score"] > 0.5).tolist()
    np.testing.assert_allclose(run_batch(b, TensorBatch({"query": q, "doc": d}))["score"],
                               out["score"], rtol=1e-6)  # same seed, same towers
    one = run_batch(a, TensorBatch({"query": q[4:5], "doc": d[4:5]}))
    np.testing.assert_allclose(one["score"], out["score"][4:5], rtol=1e-5, atol=1e-6)
