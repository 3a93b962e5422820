"""Warm-up: the batches a replica runs before it is ready, and the check that a class fits
its declared tensors (at deploy time, with a message that says what to fix)."""

from __future__ import annotations

import numpy as np
import pytest

from batching.errors import ModelError
from batching.model import VectorTransformer
from cluster.config import ModelConfig
from deployments.models import SimpleSequence, SimpleString
from deployments.replica.warmup import warm_up, warmup_sizes


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
    assert model.seen[0]["text"].tolist() == [b"0"]  # a string numeric models parse too


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


def test_the_default_bytes_warm_up_is_data_a_numeric_string_model_takes():
    c = ModelConfig(
        name="simple_string", transformer="deployments.models:SimpleString",
        inputs=[{"name": n, "datatype": "BYTES", "shape": [-1, 16]} for n in ("INPUT0", "INPUT1")],
        outputs=[{"name": n, "datatype": "BYTES", "shape": [-1, 16]}
                 for n in ("OUTPUT0", "OUTPUT1")],
        batching={"max_batch_size": 8, "preferred_batch_sizes": [8]})
    assert warm_up(c, SimpleString())["batch_sizes"] == [1, 8]


@pytest.mark.parametrize(("datatype", "item", "seen"), [
    ("INT32", [1, 2], [1, 2]),
    ("FP16", [0.5, 1.5], [0.5, 1.5]),
    ("BOOL", [True, False], [True, False]),
    ("UINT8", [255, 0], [255, 0]),
    ("BYTES", ["12", "héllo"], [b"12", "héllo".encode()]),
])
def test_warm_up_data_works_for_every_datatype(datatype, item, seen):
    model = Recorder()
    c = config(inputs=[{"name": "ids", "datatype": datatype, "shape": [-1, 2]},
                       {"name": "text", "datatype": "BYTES", "shape": [-1]}],
               warmup={"batch_sizes": [3], "data": {"ids": item}})
    warm_up(c, model)
    assert model.seen[0]["ids"].tolist() == [seen] * 3


@pytest.mark.parametrize(("item", "words"), [
    ([1, 2, 3], r"warmup.data\['ids'\] has shape \[3\], but one item of input 'ids' has "
                r"shape \[2\].*without the batch dim"),
    ([[1, 2]], r"has shape \[1, 2\].*without the batch dim"),
    (["a", "b"], r"warmup.data\['ids'\] is not INT32 data"),
])
def test_warm_up_data_that_is_not_one_item_fails_saying_so(item, words):
    c = config(inputs=[{"name": "ids", "datatype": "INT32", "shape": [-1, 2]},
                       {"name": "text", "datatype": "BYTES", "shape": [-1]}],
               warmup={"data": {"ids": item}})
    with pytest.raises(ModelError, match=words):
        warm_up(c, Recorder())


def sequence_config(**kw) -> ModelConfig:
    base = dict(name="seq", transformer="deployments.models:SimpleSequence",
                inputs=[{"name": "INPUT", "datatype": "INT32", "shape": [-1, 1]}],
                outputs=[{"name": "OUTPUT", "datatype": "INT32", "shape": [-1, 1]}],
                batching={"kind": "sequence", "max_batch_size": 4})
    return ModelConfig(**{**base, **kw})


def test_a_stateful_model_is_warmed_up_with_one_request_sequences():
    class Seen(SimpleSequence):
        def __init__(self):
            self.calls = []

        def transform(self, inputs, states, controls):
            self.calls.append((inputs.shape, states, controls.start, controls.end))
            return super().transform(inputs, states, controls)

    model = Seen()
    report = warm_up(sequence_config(warmup={"batch_sizes": [1, 4]}), model)
    assert report["batch_sizes"] == [1, 4]
    assert [c[0] for c in model.calls] == [(1, 1), (4, 1)]
    assert model.calls[1][1:] == ([0] * 4, (True,) * 4, (True,) * 4)


def test_a_stateful_model_that_does_not_fit_its_tensors_fails_at_warm_up():
    class Wide(SimpleSequence):
        def transform(self, inputs, states, controls):
            out, new = super().transform(inputs, states, controls)
            return np.repeat(out, 3, axis=1), new  # [rows, 3], declared [rows, 1]

    with pytest.raises(ModelError, match=r"does not match the tensors declared for it: "
                                         r"model 'seq': output 'OUTPUT' has shape \[1, 3\]"):
        warm_up(sequence_config(), Wide())


def test_a_stateful_model_that_raises_fails_at_warm_up_naming_the_ways_out():
    class Broken(SimpleSequence):
        def transform(self, inputs, states, controls):
            raise RuntimeError("no state for you")

    with pytest.raises(ModelError, match=r"raised on its warm-up batch.*no state for you"):
        warm_up(sequence_config(), Broken())
