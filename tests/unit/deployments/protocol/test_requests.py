"""Requests as tritonclient builds them, parsed against the spec.

No server and no Ray: Triton's own client code encodes and decodes."""

from __future__ import annotations

import gzip
import json
import zlib

import numpy as np
import pytest
import tritonclient.http as httpclient
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from tritonclient.utils import np_to_triton_dtype

from batching.errors import InvalidRequest
from deployments.protocol import (
    INFER_HEADER_LENGTH,
    ModelSpec,
    RequestedOutput,
    TensorSpec,
    encode_infer_response,
)
from tests.unit.deployments.protocol.oip_cases import (
    ALL,
    IDS,
    X,
    decode,
    json_request,
    parse,
    triton_body,
)

# --- requests built by tritonclient ---------------------------------------------------


@pytest.mark.parametrize(
    "binary",
    [
        True,
        False,
        {"x": True, "ids": False, "text": True},
        {"x": False, "ids": True, "text": False},
    ],
    ids=["binary", "json", "mixed-a", "mixed-b"],
)
def test_tritonclient_request_round_trips(binary):
    body, headers = triton_body(ALL, binary)
    request = parse(body, headers)
    assert set(request.inputs) == {"x", "ids", "text"}
    for name, array in ALL.items():
        got = request.inputs[name]
        assert got.dtype == array.dtype and got.shape == array.shape
        np.testing.assert_array_equal(got, array)
    assert all(isinstance(b, bytes) for b in request.inputs["text"].ravel())
    assert request.batch_size == 2


def test_binary_bytes_input_keeps_non_utf8_bytes():
    text = np.array([[b"\xff\x00", b"\x80"]], dtype=object)
    body, headers = triton_body({"x": X[:1], "ids": IDS[:1], "text": text})
    assert parse(body, headers).inputs["text"].tolist() == [[b"\xff\x00", b"\x80"]]


def test_request_parameters_as_tritonclient_sends_them():
    body, headers = triton_body(
        ALL, request_id="r1", sequence_id=42, sequence_start=True, priority=2, timeout=1500
    )
    sent = json.loads(body[: int(headers[INFER_HEADER_LENGTH])])
    # tritonclient puts timeout (microseconds) and priority as plain ints in parameters.
    assert sent["parameters"] == {
        "sequence_id": 42,
        "sequence_start": True,
        "sequence_end": False,
        "priority": 2,
        "timeout": 1500,
        "binary_data_output": True,
    }
    request = parse(body, headers)
    assert request.id == "r1"
    assert (request.priority, request.timeout_s) == (2, 0.0015)
    assert (request.sequence_id, request.sequence_start, request.sequence_end) == (42, True, False)
    assert request.binary_data_output is True


def test_defaults_when_no_parameters_are_sent():
    body, headers = triton_body(ALL, outputs=[httpclient.InferRequestedOutput("y")])
    request = parse(body, headers)
    assert request.parameters == {}
    assert request.id is None
    assert (request.priority, request.timeout_s, request.sequence_id) == (None, None, None)
    assert (request.sequence_start, request.sequence_end, request.binary_data_output) == (
        False,
        False,
        False,
    )


def test_string_sequence_id_and_custom_parameters_pass_through():
    body, headers = triton_body(
        ALL, sequence_id="chat-7", sequence_end=True, parameters={"temperature": 0.5}
    )
    request = parse(body, headers)
    assert request.sequence_id == "chat-7" and request.sequence_end
    assert request.parameters["temperature"] == 0.5


def test_requested_outputs_carry_their_binary_flag():
    outputs = [
        httpclient.InferRequestedOutput("label", binary_data=False),
        httpclient.InferRequestedOutput("y"),  # binary_data=True is tritonclient's default
    ]
    body, headers = triton_body(ALL, outputs=outputs)
    assert parse(body, headers).outputs_requested == [("label", False), ("y", True)]


def test_no_outputs_named_means_all_outputs_binary_per_request_parameter():
    body, headers = triton_body(ALL)
    request = parse(body, headers)
    assert request.outputs_requested == []
    assert request.binary_data_output  # tritonclient asks for binary when it names no output


def test_output_without_binary_flag_follows_binary_data_output():
    doc = json_request(outputs=[{"name": "y"}], parameters={"binary_data_output": True})
    assert parse(doc).outputs_requested == [RequestedOutput("y", True)]
    assert parse(json_request(outputs=[{"name": "y"}])).outputs_requested == [("y", False)]


def test_nested_json_data_is_accepted():
    doc = json_request(x={"name": "x", "datatype": "FP32", "shape": [2, 3], "data": X.tolist()})
    np.testing.assert_array_equal(parse(doc).inputs["x"], X)


@pytest.mark.parametrize("encoding,compress", [("gzip", gzip.compress), ("deflate", zlib.compress)])
def test_compressed_bodies_as_tritonclient_compresses_them(encoding, compress):
    body, headers = triton_body(ALL)
    request = parse(compress(body), {**headers, "Content-Encoding": encoding})
    np.testing.assert_array_equal(request.inputs["x"], X)


def test_header_lookup_ignores_case():
    body, headers = triton_body(ALL)
    lower = {k.lower(): v for k, v in headers.items()}
    np.testing.assert_array_equal(parse(body, lower).inputs["ids"], IDS)


def test_model_without_batch_dim_has_no_batch_size():
    spec = ModelSpec(
        "s", inputs=[TensorSpec("a", "INT64", [2])], outputs=[TensorSpec("b", "INT64", [])]
    )
    body, headers = triton_body({"a": np.array([1, 2], dtype=np.int64)})
    assert parse(body, headers, spec).batch_size is None


@settings(max_examples=60, deadline=None)
@given(data=st.data())
def test_any_numeric_tensor_round_trips_both_ways(data):
    dtype = data.draw(
        st.sampled_from(["?", "u1", "u2", "u4", "u8", "i1", "i2", "i4", "i8", "f2", "f4", "f8"])
    )
    shape = data.draw(hnp.array_shapes(min_dims=1, max_dims=3, min_side=1, max_side=4))
    binary = data.draw(st.booleans())
    # JSON has no NaN or Infinity: those travel as binary data only
    finite = {} if binary or dtype[0] != "f" else {
        "elements": hnp.from_dtype(np.dtype(dtype), allow_nan=False, allow_infinity=False)}
    array = data.draw(hnp.arrays(np.dtype(dtype), shape, **finite))
    datatype = np_to_triton_dtype(array.dtype)
    spec = ModelSpec(
        "p",
        inputs=[TensorSpec("t", datatype, [-1] * len(shape))],
        outputs=[TensorSpec("t", datatype, [-1] * len(shape))],
        max_batch_size=4,
    )
    body, headers = triton_body({"t": array}, binary)
    got = parse(body, headers, spec).inputs["t"]
    assert got.dtype == array.dtype
    np.testing.assert_array_equal(got, array)
    body, headers = encode_infer_response("p", "1", None, {"t": got}, [], binary)
    back = decode(body, headers).as_numpy("t")
    assert back.dtype == array.dtype
    np.testing.assert_array_equal(back, array)


@pytest.mark.parametrize("key, fix", [("sequence_id", "send a larger id as a string"),
                                      ("priority", "non-negative integer"),
                                      ("timeout", "in microseconds")])
def test_a_parameter_past_64_bits_is_refused_as_the_integer_it_was_sent_as(key, fix):
    # orjson reads 2**64 as a float: the error names an integer, not 1.8446744073709552e+19
    with pytest.raises(InvalidRequest) as e:
        parse(json_request(parameters={key: 2**64}))
    said = str(e.value)
    assert "an integer past 64 bits (18446744073709551616)" in said and fix in said, said
    assert "e+19" not in said
