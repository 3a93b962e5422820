"""Responses as tritonclient reads them back.

No server and no Ray: Triton's own client code encodes and decodes."""

from __future__ import annotations

import json
import struct

import numpy as np
import pytest
import tritonclient.http as httpclient

from batching.errors import InvalidRequest, ModelError
from deployments.protocol import (
    INFER_HEADER_LENGTH,
    RequestedOutput,
    encode_infer_response,
)
from tests.unit.deployments.protocol.oip_cases import (
    ALL,
    X,
    decode,
    parse,
    triton_body,
)

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
        data = json.loads(body)["outputs"][0]["data"]  # float32s in their shortest form
        np.testing.assert_array_equal(np.array(data, np.float32), (X * 2).ravel())


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
