"""Bad requests: a 400 that says what was wrong, or a 413.

No server and no Ray: Triton's own client code encodes and decodes."""

from __future__ import annotations

import gzip
import json
import struct

import pytest

from batching.errors import InvalidRequest
from deployments.protocol import (
    INFER_HEADER_LENGTH,
    ModelSpec,
    PayloadTooLarge,
    TensorSpec,
    check_content_length,
)
from tests.unit.deployments.protocol.oip_cases import (
    ALL,
    IDS,
    LIMIT,
    X,
    json_request,
    parse,
    triton_body,
)

# --- 400s: each says what was wrong -----------------------------------------------------


def _ids(**changes) -> dict:
    return {"name": "ids", "datatype": "INT32", "shape": [2], "data": [1, 2], **changes}


BAD_JSON_REQUESTS = [
    (b'{"inputs": [', "not valid JSON"),
    (b"\xff\xfe", "not UTF-8"),
    (b"[1, 2]", "must be an object"),
    (b"{}", "non-empty 'inputs' array; model 'm' takes ['x', 'ids', 'text']"),
    (json_request(inputs=[]), "non-empty 'inputs'"),
    (json_request(inputs=[5]), "inputs[0] must be an object with a string 'name'"),
    (json_request(ids=_ids(name="z")),
     "unexpected inference input 'z' for model 'm'; its inputs are ['x', 'ids', 'text']"),
    (json_request(ids=None), "needs inputs ['ids'] too"),
    (json_request(inputs=[_ids(), _ids()]), "input 'ids' appears twice"),
    (json_request(ids=_ids(datatype="FP32")),
     "inference input 'ids' data-type is 'FP32', but model 'm' expects 'INT32'"),
    (json_request(ids=_ids(datatype="FLOAT")), "unknown datatype 'FLOAT'; use one of BOOL"),
    (json_request(ids=_ids(datatype="BF16")), "BF16, which Raybatch does not support"),
    (json_request(ids=_ids(shape=[2, 1])), "rank 2 but the model expects rank 1"),
    (json_request(ids=_ids(shape=[-1])), "negative dim"),
    (json_request(ids=_ids(shape="2")), "'shape' must be an array of integers"),
    (json_request(ids=_ids(shape=[True])), "'shape' must be an array of integers"),
    (
        json_request(x={"name": "x", "datatype": "FP32", "shape": [2, 4], "data": [0] * 8}),
        "dim 1 must be 3, not 4",
    ),
    (json_request(ids=_ids(data=[1, 2, 3])), "holds 3 elements but shape [2] needs 2"),
    (json_request(ids=_ids(shape=[3], data=[1, 2, 3])), "disagree on the batch size"),
    (
        json_request(
            x={"name": "x", "datatype": "FP32", "shape": [0, 3], "data": []},
            ids=_ids(shape=[0], data=[]),
            text={"name": "text", "datatype": "BYTES", "shape": [0, 2], "data": []},
        ),
        "batch dim (leading dim) is 0",
    ),
    (json_request(ids=_ids(data=[1.5, 2])), "INT32 needs integers"),
    (json_request(ids=_ids(data=["1", "2"])), "INT32 needs integers"),
    (json_request(ids=_ids(data=[1, 2**40])), "outside the range of INT32"),
    (json_request(ids=_ids(data=[[1], [2, 3]])), "not a rectangular array"),
    (json_request(ids=_ids(data={"a": 1})), "'data' must be a JSON array"),
    (json_request(ids=_ids(data=None)), "'data' must be a JSON array"),
    (
        json_request(x={"name": "x", "datatype": "FP32", "shape": [2, 3], "data": [True] * 6}),
        "FP32 needs numbers",
    ),
    (
        json_request(
            text={"name": "text", "datatype": "BYTES", "shape": [2, 2], "data": [1, 2, 3, 4]}
        ),
        "BYTES needs JSON strings",
    ),
    (json_request(ids={"name": "ids", "datatype": "INT32", "shape": [2]}), "carries no data"),
    (json_request(ids=_ids(parameters=[])), "'parameters' must be a JSON object"),
    (
        json_request(ids=_ids(parameters={"shared_memory_region": "r"})),
        "shared memory, which Raybatch does not support",
    ),
    (json_request(id=7), "'id' must be a JSON string"),
    (json_request(parameters=[1]), "'parameters' must be a JSON object"),
    (json_request(parameters={"priority": -1}), "'priority' must be a non-negative integer"),
    (json_request(parameters={"priority": "high"}), "'priority' must be a non-negative integer"),
    (
        json_request(parameters={"timeout": 1.5}),
        "'timeout' must be a non-negative integer in microseconds",
    ),
    (json_request(parameters={"timeout": True}), "in microseconds"),
    (
        json_request(parameters={"sequence_id": -3}),
        "'sequence_id' must be a non-negative integer or a string",
    ),
    (json_request(parameters={"sequence_start": "yes"}), "'sequence_start' must be true or false"),
    (
        json_request(parameters={"binary_data_output": 1}),
        "'binary_data_output' must be true or false",
    ),
    (json_request(parameters={"triton_x": 1}), "'triton_' are reserved"),
    (json_request(outputs={"name": "y"}), "'outputs' must be a JSON array"),
    (json_request(outputs=[{"name": "q"}]), "no output 'q'; its outputs are ['y', 'label']"),
    (json_request(outputs=[{"name": "y"}, {"name": "y"}]), "output 'y' is requested twice"),
    (
        json_request(outputs=[{"name": "y", "parameters": {"classification": 2}}]),
        "classification, which Raybatch does not support",
    ),
    (
        json_request(outputs=[{"name": "y", "parameters": {"binary_data": "yes"}}]),
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


@pytest.mark.parametrize("shape", [[0, 2**62], [3, 0, 2**61], [0, 2**31, 2**31]])
@pytest.mark.parametrize("binary", [False, True])
def test_an_empty_tensor_whose_dims_no_array_can_have_is_a_400(shape, binary):
    # it holds nothing, so it passes the size limits; numpy cannot shape it (a 500 once)
    spec = ModelSpec("g", inputs=[TensorSpec("grid", "FP32", [-1] * len(shape))],
                     outputs=[TensorSpec("y", "FP32", [-1])], max_batch_size=0)
    entry = {"name": "grid", "datatype": "FP32", "shape": shape}
    entry.update({"parameters": {"binary_data_size": 0}} if binary else {"data": []})
    body = json.dumps({"inputs": [entry]}).encode()
    headers = {INFER_HEADER_LENGTH: str(len(body))} if binary else {}
    with pytest.raises(InvalidRequest, match="its dims multiply past what an array can hold"):
        parse(body, headers, spec=spec)


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
    doc = json.loads(json_request())
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
