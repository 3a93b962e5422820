"""Triton's example models as Raybatch serves them (`configs/triton-examples.yaml`): the
semantics Triton's example client programs check, and the config that serves them."""

from __future__ import annotations

import numpy as np
import pytest

from batching import SequenceBatchInput, StateStore
from cluster.config import DEMO_CONFIG, load_config
from deployments.models import Identity, Simple, SimpleSequence, SimpleString

CONFIG = DEMO_CONFIG.parent / "triton-examples.yaml"


def test_the_config_serves_tritons_example_models_as_triton():
    config = load_config(CONFIG)
    assert config.ingress.server_name == "triton"
    assert [m.name for m in config.models] == [
        "simple", "simple_string", "simple_identity", "simple_sequence"]
    assert config.model("simple_sequence").batching.kind == "sequence"


def test_simple_adds_and_subtracts_int32():
    a = np.arange(16, dtype=np.int32)[None]
    b = np.full((1, 16), -1, np.int32)
    out = Simple().transform({"INPUT0": a, "INPUT1": b})
    assert out["OUTPUT0"].tolist() == (a + b).tolist()
    assert out["OUTPUT1"].tolist() == (a - b).tolist() and out["OUTPUT1"].dtype == np.int32


def test_simple_string_works_on_decimal_strings_and_refuses_others():
    a = np.array([[b"3", b"-4"]], object)
    out = SimpleString().transform({"INPUT0": a, "INPUT1": np.array([[b"1", b"1"]], object)})
    assert out["OUTPUT0"].tolist() == [[b"4", b"-3"]]
    assert out["OUTPUT1"].tolist() == [[b"2", b"-5"]]
    with pytest.raises(ValueError, match="INPUT1 holds a string that is not a decimal"):
        SimpleString().transform({"INPUT0": a, "INPUT1": np.array([[b"x", b"1"]], object)})


def test_identity_returns_bytes_as_sent():
    x = np.array([[b"he\x00llo", b"\x00\x01\x02\x03"]], object)
    assert Identity().transform(x).tolist() == x.tolist()


def test_simple_sequence_is_the_input_plus_one_on_a_start_the_input_after():
    store = StateStore(SimpleSequence())

    def step(rows, ids, start, ready=None):
        n = len(ids)
        ready = ready or (True,) * n
        out = store.run(SequenceBatchInput(np.array(rows, np.int32).reshape(n, 1), ids,
                                           start, (False,) * n, ready))
        return [None if o is None else int(o[0]) for o in out]

    assert step([[0], [100]], (1, "uuid"), (True, True)) == [1, 101]
    assert step([[11], [-11]], (1, "uuid"), (False, False)) == [11, -11]
    assert step([[7], [0]], (1, None), (False, False), (True, False)) == [7, None]
    assert step([[5]], (1,), (True,)) == [6]  # a new start: +1 again
