"""The ModelInfer codec: typed contents per datatype, raw contents, limits, and outputs as
tritonclient.grpc decodes them."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2 as pb

from batching.errors import InvalidRequest
from cluster.config import TensorConfig
from deployments.grpc.codec import read_infer_request, write_infer_response
from deployments.protocol import PayloadTooLarge


def declared(name: str, datatype: str, shape=(-1,)) -> dict[str, TensorConfig]:
    return {name: TensorConfig(name=name, datatype=datatype, shape=shape)}


def typed(name: str, datatype: str, shape, field: str, values) -> pb.ModelInferRequest:
    request = pb.ModelInferRequest(model_name="m")
    tensor = request.inputs.add(name=name, datatype=datatype, shape=shape)
    getattr(tensor.contents, field).extend(values)
    return request


@pytest.mark.parametrize("datatype, field, values, dtype", [
    ("INT8", "int_contents", [-3, 4], np.int8),
    ("UINT16", "uint_contents", [7, 65535], np.uint16),
    ("INT64", "int64_contents", [-(2**40), 5], np.int64),
    ("FP64", "fp64_contents", [0.5, -1.25], np.float64),
    ("BOOL", "bool_contents", [True, False], np.bool_),
    ("BYTES", "bytes_contents", [b"\x00\xff", b"text"], object),
])
def test_typed_contents_decode_to_the_declared_dtype(datatype, field, values, dtype):
    req = read_infer_request(typed("x", datatype, [2], field, values),
                             declared("x", datatype), "m", 1 << 20)
    array = req.inputs["x"]
    assert array.dtype == np.dtype(dtype) and array.tolist() == list(values)


def test_typed_contents_must_fit_the_shape_and_the_datatype_range():
    with pytest.raises(InvalidRequest, match=r"contents.fp32_contents holds 3 elements but "
                                             r"shape \[2\] needs 2"):
        read_infer_request(typed("x", "FP32", [2], "fp32_contents", [1, 2, 3]),
                           declared("x", "FP32"), "m", 1 << 20)
    with pytest.raises(InvalidRequest, match="300 is outside the range of INT8"):
        read_infer_request(typed("x", "INT8", [1], "int_contents", [300]),
                           declared("x", "INT8"), "m", 1 << 20)
    with pytest.raises(InvalidRequest, match="FP16, which has no typed contents"):
        read_infer_request(typed("x", "FP16", [1], "fp32_contents", [1.0]),
                           declared("x", "FP16"), "m", 1 << 20)


def test_the_shape_is_checked_against_the_size_limit_before_decoding():
    request = typed("x", "FP32", [1 << 20, 1 << 10], "fp32_contents", [])
    with pytest.raises(PayloadTooLarge, match="more than 65536 bytes"):
        read_infer_request(request, declared("x", "FP32", (-1, -1)), "m", 1 << 16)


def test_outputs_go_out_raw_and_decode_in_tritonclient():
    outputs = {"y": np.array([[1.5, 2.0]], np.float32),
               "s": np.array([b"a", b"bc"], dtype=object)}
    response = write_infer_response(pb.ModelInferResponse(), "m", "1", "id-7", outputs, [])
    result = grpcclient.InferResult(response)
    assert result.as_numpy("y").tolist() == [[1.5, 2.0]]
    assert result.as_numpy("s").tolist() == [b"a", b"bc"]
    assert response.id == "id-7" and [o.datatype for o in response.outputs] == ["FP32", "BYTES"]
