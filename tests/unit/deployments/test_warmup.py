"""Warm-up: the batches a replica runs before it is ready, and the check that a class fits
its declared tensors (at deploy time, with a message that says what to fix)."""

from __future__ import annotations

import numpy as np
import pytest

from batching.errors import ModelError
from batching.model import VectorTransformer
from cluster.config import ModelConfig
from deployments.warmup import warm_up, warmup_sizes


class Recorder(VectorTransformer):
    def __init__(self, outputs=("score",)):
        self.seen: list = []
        self.outputs = outputs

    def transform(self, batch):
        self.seen.append(batch)
        n = len(batch["ids"])
        return {name: np.zeros(n, np.float32) for name in self.outputs}


def config(**kw) -> ModelConfig:
    base = dict(
        name="m", transformer="tests.unit.deployments.test_warmup:Recorder",
        inputs=[{"name": "ids", "datatype": "INT64", "shape": [-1, -1],
                 "ragged": {"axis": 1, "pad_value": 0}},
                {"name": "text", "datatype": "BYTES", "shape": [-1]}],
        outputs=[{"name": "score", "datatype": "FP32", "shape": [-1]}],
        batching={"max_batch_size": 16, "preferred_batch_sizes": [4, 16]})
    return ModelConfig(**{**base, **kw})


def test_warm_up_runs_one_then_the_preferred_sizes_with_synthesized_inputs():
    model = Recorder()
    report = warm_up(config(warmup={"count": 2, "dims": {"ids": [7]}}), model)
    assert report["batch_sizes"] == [1, 4, 16] and report["warmup_s"] >= 0
    # each batch timed: the engine's first admission predictions come from these
    assert [size for size, _ in report["warmup_batches"]] == [1, 1, 4, 4, 16, 16]  # count 2
    assert all(s >= 0 for _, s in report["warmup_batches"])
    assert [len(b["ids"]) for b in model.seen] == [1, 1, 4, 4, 16, 16]
    assert model.seen[0]["ids"].shape == (1, 7) and model.seen[0]["ids"].dtype == np.int64
    assert model.seen[0]["text"].tolist() == [b"warm-up"]


def test_configured_sizes_and_data_are_used_as_given():
    model = Recorder()
    c = config(warmup={"batch_sizes": [3, 99], "data": {"ids": [5, 6], "text": "hello"}})
    assert warmup_sizes(c) == [3, 16]  # capped at max_batch_size
    warm_up(c, model)
    assert model.seen[0]["ids"].tolist() == [[5, 6]] * 3
    assert model.seen[0]["text"].tolist() == [b"hello"] * 3


def test_disabled_warm_up_runs_nothing():
    model = Recorder()
    assert warm_up(config(warmup={"enabled": False}), model)["batch_sizes"] == []
    assert model.seen == []


def test_a_class_that_does_not_match_its_declared_outputs_fails_saying_what_differs():
    with pytest.raises(ModelError, match=r"Recorder does not match the tensors declared for "
                                         r"it: .*missing \['score'\].*undeclared \['scores'\]"):
        warm_up(config(), Recorder(outputs=("scores",)))


def test_a_model_that_raises_on_synthesized_data_names_the_ways_out():
    class Picky(Recorder):
        def transform(self, batch):
            raise ValueError("token 0 is not in my vocabulary")

    with pytest.raises(ModelError, match=r"raised on its warm-up batch of 1 .*vocabulary.*"
                                         r"warmup\.data.*warmup\.enabled: false"):
        warm_up(config(), Picky())
