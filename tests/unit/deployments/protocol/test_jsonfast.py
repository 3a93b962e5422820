"""The compiled reader of flat JSON `data` lists answers exactly what the Python path does.

`deployments.protocol._jsonfast.flat` either returns a tensor's bytes or None (the Python
path decides). Differential: for every list and datatype drawn (fixed seed), decoding
with it and without it gives the same array (dtype, bits) or the same error.
"""

from __future__ import annotations

import shutil

import numpy as np
import pytest
from hypothesis import HealthCheck, given, seed, settings
from hypothesis import strategies as st

from batching.errors import InvalidRequest
from deployments.protocol import jsondata
from deployments.protocol.jsondata import decode_json_data

fast = jsondata._fast
needs_fast = pytest.mark.skipif(
    fast is None, reason="deployments/protocol/_jsonfast.c is not built: run `make setup` "
                         "(or `pip install -e .`) on a machine with a C compiler")
NUMERIC = ["UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
           "FP16", "FP32", "FP64", "BOOL"]


def test_the_reader_is_built_where_a_c_compiler_is():
    if shutil.which("cc") is None and shutil.which("gcc") is None:
        pytest.skip("no C compiler here: the Python path alone serves (as intended)")
    assert fast is not None, ("a C compiler is here but deployments/protocol/_jsonfast.c "
                              "was not built: run `pip install -e .` and read its output")


def outcome(data, datatype: str, use_fast: bool, monkeypatch) -> tuple:
    monkeypatch.setattr(jsondata, "_fast", fast if use_fast else None)
    try:
        a = decode_json_data(data, datatype, [len(data)], "input 'x'")
    except InvalidRequest as e:
        return ("error", str(e))
    return ("array", a.dtype.str, a.shape, a.tobytes())


EDGES = [2**53, 2**53 + 1, -(2**53) - 1, 2**63 - 1, 2**63, 2**64, -(2**63), -1, 0, 255, 256,
         -128, -129, 65535, 65536, 2**31 - 1, 2**31, 2**32, 3.4028234663852886e38,
         3.4028235677973366e38, 1e39, -1e39, 1.5, -0.0, 5e-324, 1e-46, True, False]
values = st.one_of(st.integers(min_value=-(2**70), max_value=2**70),
                   st.floats(allow_nan=False, allow_infinity=False), st.booleans(),
                   st.sampled_from(EDGES), st.none(), st.text(max_size=3))


@needs_fast
@seed(20261126)
@settings(max_examples=3000, deadline=None, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.one_of(st.lists(values, min_size=1, max_size=12),
                      st.lists(st.sampled_from(EDGES), min_size=1, max_size=6),
                      st.lists(st.integers(-300, 300), min_size=1, max_size=12),
                      st.lists(st.floats(-1e6, 1e6), min_size=1, max_size=12)),
       datatype=st.sampled_from(NUMERIC))
def test_with_and_without_the_reader_the_answer_is_the_same(data, datatype, monkeypatch):
    assert outcome(data, datatype, True, monkeypatch) == outcome(data, datatype, False,
                                                                  monkeypatch)


@needs_fast
@pytest.mark.parametrize(("data", "code"), [
    ([1.0, True], "f4"),  # true/false among numbers: the Python path refuses it
    ([1, 2.5], "i4"),  # a fraction among integers
    ([2**53 + 1], "f4"),  # past 2**53: numpy's own rounding decides
    ([2**63], "i8"), ([2**63], "u8"), ([-1], "u1"), ([256], "u1"), ([128], "i1"),
    ([1e39], "f4"), ([float("inf")], "f8"), ([None], "f8"), (["1"], "i8"),
    ([[1.0]], "f4"),  # nested: the Python path
    ([], "f4"), ([1.0], "f2"), ([1], "b1"), ([1], "x"),
])
def test_what_the_reader_leaves_to_the_python_path(data, code):
    assert fast.flat(data, code) is None


@needs_fast
def test_what_the_reader_answers_is_the_tensor_itself():
    assert np.frombuffer(fast.flat([1, 2.5, -0.0], "f4"), np.float32).tolist() == [1.0, 2.5, 0.0]
    assert np.signbit(np.frombuffer(fast.flat([-0.0], "f8"), np.float64))[0]
    assert np.frombuffer(fast.flat([-128, 127], "i1"), np.int8).tolist() == [-128, 127]
    assert np.frombuffer(fast.flat([0, 65535], "u2"), np.uint16).tolist() == [0, 65535]
    assert np.frombuffer(fast.flat([2**63 - 1], "i8"), np.int64).tolist() == [2**63 - 1]
    out = decode_json_data([0.5] * 6, "FP32", [2, 3], "input 'x'")
    assert out.shape == (2, 3) and out.dtype == np.float32 and out.flags.writeable
    with pytest.raises(TypeError):
        fast.flat((1.0,), "f4")  # a list, nothing else
