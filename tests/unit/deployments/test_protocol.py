"""The OIP protocol layer against Triton's own client code, with no server and no Ray.

Requests are built by `tritonclient.http.InferenceServerClient.generate_request_body`
(what `client.infer` sends) and responses are read back by its `parse_response_body`
(what `client.infer` returns), so a drift from Triton's wire format fails here.
"""

from __future__ import annotations

import gzip
import importlib.metadata
import json
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import numpy as np
import pytest
import tritonclient.http as httpclient
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp
from tritonclient.http._utils import _get_error
from tritonclient.utils import np_to_triton_dtype

from batching.errors import InvalidRequest, ModelError
from deployments.protocol import (
    INFER_HEADER_LENGTH,
    BatchStats,
    DurationStat,
    ModelCounters,
    ModelSpec,
    PayloadTooLarge,
    RequestedOutput,
    TensorSpec,
    check_content_length,
    encode_infer_response,
    error_body,
    metadata_json,
    model_config_json,
    parse_infer_request,
    server_metadata_json,
    stats_json,
)

Client = httpclient.InferenceServerClient
LIMIT = 1 << 20

SPEC = ModelSpec(
    "m",
    version="3",
    inputs=[
        TensorSpec("x", "FP32", [-1, 3]),
        TensorSpec("ids", "INT32", [-1]),
        TensorSpec("text", "BYTES", [-1, 2]),
    ],
    outputs=[TensorSpec("y", "FP32", [-1, 3]), TensorSpec("label", "BYTES", [-1])],
    max_batch_size=8,
)
X = np.arange(6, dtype=np.float32).reshape(2, 3) / 7
IDS = np.array([7, -2147483648], dtype=np.int32)
TEXT = np.array([[b"a", "é€".encode()], [b"", b"long " * 20]], dtype=object)


def triton_body(arrays: dict, binary=True, **kwargs) -> tuple[bytes, dict[str, str]]:
    """Body and headers exactly as tritonclient's `infer` would send them."""
    inputs = []
    for name, array in arrays.items():
        inp = httpclient.InferInput(name, list(array.shape), np_to_triton_dtype(array.dtype))
        inp.set_data_from_numpy(
            array, binary_data=binary if isinstance(binary, bool) else binary[name]
        )
        inputs.append(inp)
    body, json_size = Client.generate_request_body(inputs, **kwargs)
    headers = {} if json_size is None else {INFER_HEADER_LENGTH: str(json_size)}
    return body, headers


def parse(body: bytes, headers: dict | None = None, spec: ModelSpec = SPEC, limit: int = LIMIT):
    return parse_infer_request(body, headers or {}, spec, limit)


def decode(body: bytes, headers: dict[str, str]) -> httpclient.InferResult:
    """Read a response the way tritonclient does."""
    length = headers.get(INFER_HEADER_LENGTH)
    return Client.parse_response_body(body, header_length=None if length is None else int(length))


ALL = {"x": X, "ids": IDS, "text": TEXT}


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
    doc = _json_request(outputs=[{"name": "y"}], parameters={"binary_data_output": True})
    assert parse(doc).outputs_requested == [RequestedOutput("y", True)]
    assert parse(_json_request(outputs=[{"name": "y"}])).outputs_requested == [("y", False)]


def test_nested_json_data_is_accepted():
    doc = _json_request(x={"name": "x", "datatype": "FP32", "shape": [2, 3], "data": X.tolist()})
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
    array = data.draw(hnp.arrays(np.dtype(dtype), shape))
    binary = data.draw(st.booleans())
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


# --- responses read by tritonclient -----------------------------------------------------

OUTPUTS = {
    "y": X * 2,
    "label": np.array([b"cat", "dög".encode()], dtype=object),
    "mask": np.array([[True, False]]),
    "half": np.array([1.5, -0.25], dtype=np.float16),
    "big": np.array([2**63 + 5], dtype=np.uint64),
}


@pytest.mark.parametrize("binary", [True, False])
def test_response_decodes_with_tritonclient(binary):
    body, headers = encode_infer_response("m", "3", "r1", OUTPUTS, [], binary)
    result = decode(body, headers)
    for name, array in OUTPUTS.items():
        got = result.as_numpy(name)
        if name == "label" and not binary:  # BYTES in JSON come back as str
            assert got.tolist() == ["cat", "dög"]
            continue
        assert got.dtype == array.dtype
        np.testing.assert_array_equal(got, array)
    response = result.get_response()
    assert (response["model_name"], response["model_version"], response["id"]) == ("m", "3", "r1")
    if binary:
        assert headers["Content-Type"] == "application/octet-stream"
        assert int(headers[INFER_HEADER_LENGTH]) < len(body)
    else:
        assert headers == {"Content-Type": "application/json"}
        assert json.loads(body)["outputs"][0]["data"] == (X * 2).ravel().tolist()


def test_response_holds_only_requested_outputs_in_their_order_and_format():
    requested = [RequestedOutput("label", False), RequestedOutput("y", True)]
    body, headers = encode_infer_response("m", "3", None, OUTPUTS, requested, False)
    result = decode(body, headers)
    response = result.get_response()
    assert [o["name"] for o in response["outputs"]] == ["label", "y"]
    assert "id" not in response
    assert response["outputs"][0]["data"] == ["cat", "dög"]
    assert response["outputs"][1]["parameters"] == {"binary_data_size": X.nbytes}
    np.testing.assert_array_equal(result.as_numpy("y"), X * 2)
    assert result.as_numpy("half") is None


def test_binary_bytes_output_keeps_non_utf8_bytes_and_empty_elements():
    label = np.array([b"\xff", b"", b"ok"], dtype=object)
    body, headers = encode_infer_response(
        "m", "1", None, {"label": label}, [("label", True)], False
    )
    json_size = int(headers[INFER_HEADER_LENGTH])
    assert body[json_size:] == b"".join(struct.pack("<I", len(b)) + b for b in label)
    assert decode(body, headers).as_numpy("label").tolist() == [b"\xff", b"", b"ok"]


def test_non_contiguous_and_big_endian_outputs_are_sent_row_major_little_endian():
    outputs = {"t": np.arange(6, dtype=np.int32).reshape(2, 3).T, "b": np.array([1.5, 2], ">f4")}
    body, headers = encode_infer_response("m", "1", None, outputs, [], True)
    result = decode(body, headers)
    np.testing.assert_array_equal(result.as_numpy("t"), outputs["t"])
    np.testing.assert_array_equal(result.as_numpy("b"), [1.5, 2.0])


def test_missing_output_is_a_model_error():
    with pytest.raises(ModelError, match=r"not 'label'"):
        encode_infer_response("m", "1", None, {"y": X}, [("label", True)], False)


def test_unsupported_output_dtype_is_a_model_error():
    with pytest.raises(ModelError, match=r"complex64"):
        encode_infer_response("m", "1", None, {"y": np.zeros(2, np.complex64)}, [], True)


def test_non_utf8_bytes_cannot_travel_as_json():
    label = np.array([b"\xff"], dtype=object)
    with pytest.raises(InvalidRequest, match=r"not UTF-8.*binary_data=true"):
        encode_infer_response("m", "1", None, {"label": label}, [("label", False)], False)


def test_end_to_end_request_model_response():
    outputs = [httpclient.InferRequestedOutput("y", binary_data=False)]
    body, headers = triton_body(ALL, outputs=outputs, request_id="abc")
    request = parse(body, headers)
    result_arrays = {"y": request.inputs["x"] + 1, "label": request.inputs["text"][:, 0]}
    out_body, out_headers = encode_infer_response(
        "m", "3", request.id, result_arrays, request.outputs_requested, request.binary_data_output
    )
    result = decode(out_body, out_headers)
    np.testing.assert_allclose(result.as_numpy("y"), X + 1)
    assert result.as_numpy("label") is None
    assert result.get_response()["id"] == "abc"


# --- 400s: each says what was wrong -----------------------------------------------------


def _json_request(**overrides) -> bytes:
    """A valid JSON-only request; keyword args replace one input, or set a top-level key."""
    inputs = {
        "x": {"name": "x", "datatype": "FP32", "shape": [2, 3], "data": X.ravel().tolist()},
        "ids": {"name": "ids", "datatype": "INT32", "shape": [2], "data": [1, 2]},
        "text": {
            "name": "text",
            "datatype": "BYTES",
            "shape": [2, 2],
            "data": ["a", "b", "c", "d"],
        },
    }
    doc: dict = {}
    for key, value in overrides.items():
        if key in inputs:
            inputs[key] = value
        else:
            doc[key] = value
    doc.setdefault("inputs", [v for v in inputs.values() if v is not None])
    return json.dumps(doc).encode()


def _ids(**changes) -> dict:
    return {"name": "ids", "datatype": "INT32", "shape": [2], "data": [1, 2], **changes}


BAD_JSON_REQUESTS = [
    (b'{"inputs": [', "not valid JSON"),
    (b"\xff\xfe", "not UTF-8"),
    (b"[1, 2]", "must be an object"),
    (b"{}", "non-empty 'inputs' array; model 'm' takes ['x', 'ids', 'text']"),
    (_json_request(inputs=[]), "non-empty 'inputs'"),
    (_json_request(inputs=[5]), "inputs[0] must be an object with a string 'name'"),
    (_json_request(ids=_ids(name="z")), "no input 'z'; its inputs are ['x', 'ids', 'text']"),
    (_json_request(ids=None), "needs inputs ['ids'] too"),
    (_json_request(inputs=[_ids(), _ids()]), "input 'ids' appears twice"),
    (_json_request(ids=_ids(datatype="FP32")), "datatype FP32 but model 'm' expects INT32"),
    (_json_request(ids=_ids(datatype="FLOAT")), "unknown datatype 'FLOAT'; use one of BOOL"),
    (_json_request(ids=_ids(datatype="BF16")), "BF16, which Raybatch does not support"),
    (_json_request(ids=_ids(shape=[2, 1])), "rank 2 but the model expects rank 1"),
    (_json_request(ids=_ids(shape=[-1])), "negative dim"),
    (_json_request(ids=_ids(shape="2")), "'shape' must be an array of integers"),
    (_json_request(ids=_ids(shape=[True])), "'shape' must be an array of integers"),
    (
        _json_request(x={"name": "x", "datatype": "FP32", "shape": [2, 4], "data": [0] * 8}),
        "dim 1 must be 3, not 4",
    ),
    (_json_request(ids=_ids(data=[1, 2, 3])), "holds 3 elements but shape [2] needs 2"),
    (_json_request(ids=_ids(shape=[3], data=[1, 2, 3])), "disagree on the batch size"),
    (
        _json_request(
            x={"name": "x", "datatype": "FP32", "shape": [0, 3], "data": []},
            ids=_ids(shape=[0], data=[]),
            text={"name": "text", "datatype": "BYTES", "shape": [0, 2], "data": []},
        ),
        "batch dim (leading dim) is 0",
    ),
    (_json_request(ids=_ids(data=[1.5, 2])), "INT32 needs integers"),
    (_json_request(ids=_ids(data=["1", "2"])), "INT32 needs integers"),
    (_json_request(ids=_ids(data=[1, 2**40])), "outside the range of INT32"),
    (_json_request(ids=_ids(data=[[1], [2, 3]])), "not a rectangular array"),
    (_json_request(ids=_ids(data={"a": 1})), "'data' must be a JSON array"),
    (_json_request(ids=_ids(data=None)), "'data' must be a JSON array"),
    (
        _json_request(x={"name": "x", "datatype": "FP32", "shape": [2, 3], "data": [True] * 6}),
        "FP32 needs numbers",
    ),
    (
        _json_request(
            text={"name": "text", "datatype": "BYTES", "shape": [2, 2], "data": [1, 2, 3, 4]}
        ),
        "BYTES needs JSON strings",
    ),
    (_json_request(ids={"name": "ids", "datatype": "INT32", "shape": [2]}), "carries no data"),
    (_json_request(ids=_ids(parameters=[])), "'parameters' must be a JSON object"),
    (
        _json_request(ids=_ids(parameters={"shared_memory_region": "r"})),
        "shared memory, which Raybatch does not support",
    ),
    (_json_request(id=7), "'id' must be a JSON string"),
    (_json_request(parameters=[1]), "'parameters' must be a JSON object"),
    (_json_request(parameters={"priority": -1}), "'priority' must be a non-negative integer"),
    (_json_request(parameters={"priority": "high"}), "'priority' must be a non-negative integer"),
    (
        _json_request(parameters={"timeout": 1.5}),
        "'timeout' must be a non-negative integer in microseconds",
    ),
    (_json_request(parameters={"timeout": True}), "in microseconds"),
    (
        _json_request(parameters={"sequence_id": -3}),
        "'sequence_id' must be a non-negative integer or a string",
    ),
    (_json_request(parameters={"sequence_start": "yes"}), "'sequence_start' must be true or false"),
    (
        _json_request(parameters={"binary_data_output": 1}),
        "'binary_data_output' must be true or false",
    ),
    (_json_request(parameters={"triton_x": 1}), "'triton_' are reserved"),
    (_json_request(outputs={"name": "y"}), "'outputs' must be a JSON array"),
    (_json_request(outputs=[{"name": "q"}]), "no output 'q'; its outputs are ['y', 'label']"),
    (_json_request(outputs=[{"name": "y"}, {"name": "y"}]), "output 'y' is requested twice"),
    (
        _json_request(outputs=[{"name": "y", "parameters": {"classification": 2}}]),
        "classification, which Raybatch does not support",
    ),
    (
        _json_request(outputs=[{"name": "y", "parameters": {"binary_data": "yes"}}]),
        "binary_data must be true or false",
    ),
]


@pytest.mark.parametrize("body,message", BAD_JSON_REQUESTS)
def test_bad_request_is_a_400_saying_what_is_wrong(body, message):
    with pytest.raises(InvalidRequest) as info:
        parse(body)
    assert type(info.value) is InvalidRequest and info.value.http_status == 400
    assert message in str(info.value)


def _binary_request(sizes: dict[str, int], extra: bytes = b"", header_delta: int = 0):
    """A valid binary request whose declared binary_data_size values are overridden."""
    body, headers = triton_body(ALL)
    json_size = int(headers[INFER_HEADER_LENGTH])
    doc = json.loads(body[:json_size])
    for entry in doc["inputs"]:
        if entry["name"] in sizes:
            entry["parameters"]["binary_data_size"] = sizes[entry["name"]]
    head = json.dumps(doc).encode()
    return head + body[json_size:] + extra, {INFER_HEADER_LENGTH: str(len(head) + header_delta)}


def test_binary_size_not_matching_the_shape():
    body, headers = _binary_request({"x": 20})  # 24 bytes follow for x
    with pytest.raises(InvalidRequest, match=r"binary_data_size is 20 bytes but shape \[2, 3\]"):
        parse(body, headers)


def test_binary_sizes_running_past_the_body():
    body, headers = _binary_request({"text": 10_000})
    with pytest.raises(InvalidRequest, match=r"binary_data_size=10000 .* runs past"):
        parse(body, headers)


def test_bytes_left_after_the_last_input():
    body, headers = _binary_request({}, extra=b"\x00" * 5)
    with pytest.raises(InvalidRequest, match=r"5 bytes after the JSON header belong to no input"):
        parse(body, headers)


def test_binary_data_without_the_header_length():
    body, _ = triton_body(ALL)
    with pytest.raises(InvalidRequest, match=r"not UTF-8.*Inference-Header-Content-Length"):
        parse(body, {})
    doc = json.loads(_json_request())
    doc["inputs"][1] = _ids(parameters={"binary_data_size": 8})
    with pytest.raises(InvalidRequest, match=r"no Inference-Header-Content-Length header"):
        parse(json.dumps(doc).encode())


@pytest.mark.parametrize(
    "value,message",
    [("abc", "must be a non-negative integer"), ("-4", "non-negative"), ("0", "between 1 and")],
)
def test_bad_header_length(value, message):
    body, _ = triton_body(ALL)
    with pytest.raises(InvalidRequest, match=message):
        parse(body, {INFER_HEADER_LENGTH: value})


def test_header_length_past_the_body():
    body, headers = _binary_request({}, header_delta=100_000)
    with pytest.raises(InvalidRequest, match=r"between 1 and the body's \d+ bytes"):
        parse(body, headers)


def _with_raw_text(raw: bytes) -> tuple[bytes, dict[str, str]]:
    """A binary request whose BYTES input `text` carries `raw` as its data."""
    body, headers = triton_body({"x": X, "ids": IDS})
    json_size = int(headers[INFER_HEADER_LENGTH])
    doc = json.loads(body[:json_size])
    doc["inputs"].append(
        {
            "name": "text",
            "datatype": "BYTES",
            "shape": [2, 2],
            "parameters": {"binary_data_size": len(raw)},
        }
    )
    head = json.dumps(doc).encode()
    return head + body[json_size:] + raw, {INFER_HEADER_LENGTH: str(len(head))}


@pytest.mark.parametrize(
    "raw,message",
    [
        (struct.pack("<I", 1) + b"a" * 1, "ends after 1 of 4 elements"),
        (struct.pack("<I", 99) + b"abc", "element 0 claims 99 bytes but only 3 remain"),
        (b"".join(struct.pack("<I", 1) + b"a" for _ in range(4)) + b"zz", "2 bytes are left over"),
    ],
)
def test_malformed_binary_bytes_tensor(raw, message):
    body, headers = _with_raw_text(raw)
    with pytest.raises(InvalidRequest, match=message):
        parse(body, headers)


def test_unknown_content_encoding_and_corrupt_gzip():
    body, headers = triton_body(ALL)
    with pytest.raises(InvalidRequest, match=r"Content-Encoding 'br' is not supported"):
        parse(body, {**headers, "Content-Encoding": "br"})
    with pytest.raises(InvalidRequest, match=r"not valid gzip"):
        parse(b"not gzip", {"Content-Encoding": "gzip"})
    with pytest.raises(InvalidRequest, match=r"truncated"):
        parse(gzip.compress(body)[:-12], {**headers, "Content-Encoding": "gzip"})


# --- 413 --------------------------------------------------------------------------------


def test_body_over_the_limit_is_413():
    body, headers = triton_body(ALL)
    with pytest.raises(PayloadTooLarge) as info:
        parse(body, headers, limit=len(body) - 1)
    assert info.value.http_status == 413 and isinstance(info.value, InvalidRequest)
    assert f"{len(body)} bytes, more than this server's limit of {len(body) - 1}" in str(info.value)
    assert parse(body, headers, limit=len(body)).batch_size == 2


def test_content_length_checked_before_reading():
    with pytest.raises(PayloadTooLarge):
        check_content_length({"Content-Length": "2049"}, 2048)
    check_content_length({"content-length": "2048"}, 2048)
    check_content_length({}, 2048)


def test_compressed_body_inflating_past_the_limit_is_413():
    bomb = gzip.compress(b"\x00" * (10 * LIMIT))
    assert len(bomb) < LIMIT
    with pytest.raises(PayloadTooLarge, match=r"limit of 1048576"):
        parse(bomb, {"Content-Encoding": "gzip"})


# --- metadata, config, server, stats, errors --------------------------------------------


def test_model_metadata_is_oip():
    assert metadata_json(SPEC) == {
        "name": "m",
        "versions": ["3"],
        "platform": "raybatch",
        "inputs": [
            {"name": "x", "datatype": "FP32", "shape": [-1, 3]},
            {"name": "ids", "datatype": "INT32", "shape": [-1]},
            {"name": "text", "datatype": "BYTES", "shape": [-1, 2]},
        ],
        "outputs": [
            {"name": "y", "datatype": "FP32", "shape": [-1, 3]},
            {"name": "label", "datatype": "BYTES", "shape": [-1]},
        ],
    }


def test_model_config_is_tritons_without_the_batch_dim():
    config = model_config_json(
        SPEC, extra={"dynamic_batching": {"max_queue_delay_microseconds": 100}}
    )
    assert config["max_batch_size"] == 8
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == [
        ("x", "TYPE_FP32", [3]),
        ("ids", "TYPE_INT32", []),
        ("text", "TYPE_STRING", [2]),
    ]
    assert [(t["data_type"], t["dims"]) for t in config["output"]] == [
        ("TYPE_FP32", [3]),
        ("TYPE_STRING", []),
    ]
    assert config["dynamic_batching"] == {"max_queue_delay_microseconds": 100}
    flat = ModelSpec(
        "f", inputs=[TensorSpec("a", "UINT8", [4, -1])], outputs=[TensorSpec("b", "BOOL", [1])]
    )
    assert model_config_json(flat)["input"][0]["dims"] == [4, -1]
    assert model_config_json(flat)["max_batch_size"] == 0


@pytest.mark.parametrize(
    "build,message",
    [
        (lambda: TensorSpec("a", "BF16", [1]), "BF16"),
        (lambda: TensorSpec("a", "FP32", [-2]), "dims must be integers >= 0, or -1"),
        (
            lambda: ModelSpec(
                "b",
                inputs=[TensorSpec("a", "FP32", [3])],
                outputs=[TensorSpec("o", "FP32", [-1])],
                max_batch_size=4,
            ),
            "input 'a' needs -1 as its leading (batch) dim",
        ),
        (
            lambda: ModelSpec(
                "d",
                inputs=[TensorSpec("a", "FP32", [1])] * 2,
                outputs=[TensorSpec("o", "FP32", [1])],
            ),
            "duplicate input names",
        ),
        (
            lambda: ModelSpec("e", inputs=[TensorSpec("a", "FP32", [1])]),
            "at least one input and one output",
        ),
    ],
)
def test_bad_specs_fail_when_built(build, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        build()


def test_server_metadata_names_the_extensions():
    body = server_metadata_json()
    assert body["name"] == "raybatch"
    assert body["version"] == importlib.metadata.version("raybatch")
    assert {"binary_tensor_data", "statistics"} <= set(body["extensions"])


def test_stats_use_tritons_field_names():
    counters = ModelCounters(
        last_inference_ms=1_700_000_000_000,
        inference_count=10,
        execution_count=3,
        success=DurationStat(4, 4000),
        fail=DurationStat(1, 10),
        queue=DurationStat(4, 400),
        compute_infer=DurationStat(3, 3000),
        batch_stats=(
            BatchStats(8, compute_infer=DurationStat(1, 2000)),
            BatchStats(1, compute_infer=DurationStat(2, 1000)),
        ),
    )
    body = json.loads(json.dumps(stats_json("m", "3", counters)))
    (stat,) = body["model_stats"]
    assert (stat["name"], stat["version"], stat["last_inference"]) == ("m", "3", 1_700_000_000_000)
    assert (stat["inference_count"], stat["execution_count"]) == (10, 3)
    assert set(stat["inference_stats"]) == {
        "success",
        "fail",
        "queue",
        "compute_input",
        "compute_infer",
        "compute_output",
        "cache_hit",
        "cache_miss",
    }
    assert stat["inference_stats"]["success"] == {"count": 4, "ns": 4000}
    assert stat["inference_stats"]["compute_input"] == {"count": 0, "ns": 0}
    assert [b["batch_size"] for b in stat["batch_stats"]] == [1, 8]
    assert stat["batch_stats"][1] == {
        "batch_size": 8,
        "compute_input": {"count": 0, "ns": 0},
        "compute_infer": {"count": 1, "ns": 2000},
        "compute_output": {"count": 0, "ns": 0},
    }


class _ErrorResponse:
    """Just enough of a geventhttpclient response for tritonclient's error reader."""

    def __init__(self, status_code: int, body: bytes):
        self.status_code, self._body = status_code, body

    def read(self) -> bytes:
        return self._body


def test_error_body_is_what_tritonclient_reads():
    body = error_body('input "x" is wrong')
    assert json.loads(body) == {"error": 'input "x" is wrong'}
    error = _get_error(_ErrorResponse(400, body))
    assert error.message() == 'input "x" is wrong' and error.status() == "400"


def test_protocol_imports_neither_ray_nor_a_web_framework():
    script = (
        "import sys, deployments.protocol\n"
        "heavy = ('ray', 'fastapi', 'starlette', 'tritonclient')\n"
        "print(sorted(m for m in heavy if m in sys.modules))"
    )
    root = Path(__file__).resolve().parents[3]
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
