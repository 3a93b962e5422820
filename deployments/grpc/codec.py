"""`ModelInfer` as arrays: a request proto in, a response proto out; no server, no Ray.

Decides what a `ModelInferRequest` means, the way Triton reads it: every input's
data is either in `raw_input_contents` (one entry per input, in input order,
little-endian, BYTES as 4-byte length-prefixed elements: what `tritonclient.grpc`
sends) or in its typed `contents` (`fp32_contents`, `int_contents`, ...; FP16 has
none); request `parameters` carry `priority` (uint, 1 = highest), `timeout`
(microseconds), `sequence_id` (int or string), `sequence_start`/`sequence_end`;
`outputs` select what comes back, all of them when empty. Every output travels in
`raw_output_contents`, which `tritonclient.grpc`'s `as_numpy` reads.

Invariant: anything wrong raises `InvalidRequest` naming the tensor or parameter
and the fix, before an array reaches the engine; an input is decoded with exactly
the element count its shape promises (checked before anything is allocated).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np

from batching.errors import InvalidRequest
from cluster.config import TensorConfig
from deployments.protocol import PayloadTooLarge
from deployments.protocol.binary import check_dims, decode_binary, encode_binary, num_elements
from deployments.protocol.datatypes import NUMPY_DTYPES, check_datatype, datatype_of
from deployments.protocol.request import InferRequest, RequestedOutput
from deployments.protocol.wording import unexpected_input, wrong_datatype

# The typed field of InferTensorContents for each datatype (FP16: raw only).
CONTENTS_FIELD = {
    "BOOL": "bool_contents", "INT8": "int_contents", "INT16": "int_contents",
    "INT32": "int_contents", "INT64": "int64_contents", "UINT8": "uint_contents",
    "UINT16": "uint_contents", "UINT32": "uint_contents", "UINT64": "uint64_contents",
    "FP32": "fp32_contents", "FP64": "fp64_contents", "BYTES": "bytes_contents",
}
_UINT_PARAMS = ("priority", "timeout")
_BOOL_PARAMS = ("sequence_start", "sequence_end")


def read_infer_request(request: Any, inputs: Mapping[str, TensorConfig], model: str,
                       max_bytes: int) -> InferRequest:
    """Inputs, parameters and requested outputs of a `ModelInferRequest` for `model`,
    whose declared inputs are `inputs`; `max_bytes` bounds the decoded tensors."""
    if not request.inputs:
        raise InvalidRequest(f"the request has no inputs; model {model!r} takes "
                             f"{list(inputs)}")
    raw = raw_contents(request)
    arrays: dict[str, np.ndarray] = {}
    total = 0
    for i, tensor in enumerate(request.inputs):
        where = f"input {tensor.name!r}"
        declared = inputs.get(tensor.name)
        if declared is None:
            raise InvalidRequest(unexpected_input(tensor.name, model, list(inputs)))
        if tensor.name in arrays:
            raise InvalidRequest(f"{where} appears twice; send each input once")
        datatype = check_datatype(tensor.datatype, where)
        if datatype != declared.datatype:
            raise InvalidRequest(wrong_datatype(tensor.name, datatype, model,
                                                declared.datatype))
        shape = input_shape(tensor.shape, where)
        total += num_elements(shape) * max(NUMPY_DTYPES[datatype].itemsize, 1)
        if total > max_bytes:
            raise PayloadTooLarge(f"the inputs hold more than {max_bytes} bytes, this "
                                  "server's limit; send fewer items per request")
        arrays[tensor.name] = decode_input(tensor, datatype, shape, raw[i] if raw else None,
                                           where)
    return InferRequest(request.id or None, arrays, read_parameters(request.parameters),
                        _outputs(request.outputs), None)


def raw_contents(request: Any) -> list[bytes]:
    """The request's `raw_input_contents` ([] when its inputs use typed contents)."""
    raw = list(request.raw_input_contents)
    if raw and len(raw) != len(request.inputs):
        raise InvalidRequest(f"raw_input_contents has {len(raw)} entries for "
                             f"{len(request.inputs)} inputs: give every input its raw "
                             "contents, in input order, or use typed contents for all")
    return raw


def decode_input(tensor: Any, datatype: str, shape: list[int], raw: bytes | None,
                 where: str) -> np.ndarray:
    """One input's array: from its raw contents, or (`raw` None) its typed contents."""
    if raw is not None:
        return decode_binary(memoryview(raw), datatype, shape, where)
    return _typed(tensor, datatype, shape, where)


def input_shape(shape: Any, where: str) -> list[int]:
    dims = list(shape)
    if any(d < 0 for d in dims):
        raise InvalidRequest(f"{where} has shape {dims} with a negative dim; a request gives "
                             "the actual size of every dim")
    check_dims(dims, where)
    return dims


def _typed(tensor: Any, datatype: str, shape: list[int], where: str) -> np.ndarray:
    field = CONTENTS_FIELD.get(datatype)
    if field is None:
        raise InvalidRequest(f"{where} is {datatype}, which has no typed contents in the "
                             "protocol: send it in raw_input_contents")
    values = getattr(tensor.contents, field)
    expected = num_elements(shape)
    if len(values) != expected:
        raise InvalidRequest(f"{where}: contents.{field} holds {len(values)} elements but "
                             f"shape {shape} needs {expected}")
    if datatype == "BYTES":
        array = np.empty(expected, dtype=object)
        array[:] = list(values)
        return array.reshape(shape)
    dtype = NUMPY_DTYPES[datatype]
    if dtype.kind in "iu":
        info = np.iinfo(dtype)
        bad = next((v for v in values if not info.min <= v <= info.max), None)
        if bad is not None:
            raise InvalidRequest(f"{where}: {bad} is outside the range of {datatype}")
    return np.asarray(values, dtype=dtype).reshape(shape)


def read_parameters(params: Mapping[str, Any]) -> dict[str, Any]:
    """Request parameters as Python values, Triton's reserved ones checked."""
    out: dict[str, Any] = {}
    for key, param in params.items():
        kind = param.WhichOneof("parameter_choice")
        value = getattr(param, kind) if kind else None
        if key.startswith("triton_"):
            raise InvalidRequest(f"parameter {key!r}: keys starting with 'triton_' are "
                                 "reserved")
        if key in _UINT_PARAMS and (kind not in ("int64_param", "uint64_param") or value < 0):
            raise InvalidRequest(f"parameter {key!r} must be a non-negative integer, got "
                                 f"{value!r}")
        if key == "sequence_id" and kind not in ("int64_param", "uint64_param",
                                                 "string_param"):
            raise InvalidRequest(f"parameter 'sequence_id' must be an integer or a string, "
                                 f"got {value!r}")
        if key in _BOOL_PARAMS and kind != "bool_param":
            raise InvalidRequest(f"parameter {key!r} must be a bool, got {value!r}")
        out[key] = value
    return out


def _outputs(requested: Any) -> list[RequestedOutput]:
    names: list[RequestedOutput] = []
    for entry in requested:
        if any(r.name == entry.name for r in names):
            raise InvalidRequest(f"output {entry.name!r} is requested twice; name it once")
        names.append(RequestedOutput(entry.name, True))
    return names


def check_outputs(requested: list[RequestedOutput], outputs: Mapping[str, TensorConfig],
                  model: str) -> None:
    """Refuse requested outputs the model does not declare, before the request runs."""
    for r in requested:
        if r.name not in outputs:
            raise InvalidRequest(f"model {model!r} has no output {r.name!r}; its outputs "
                                 f"are {list(outputs)}")


def write_infer_response(response: Any, model: str, version: str, request_id: str | None,
                         outputs: Mapping[str, np.ndarray],
                         requested: list[RequestedOutput]) -> Any:
    """Fill `response` (a ModelInferResponse) with the requested outputs (all when none
    were named), each in `raw_output_contents`."""
    response.model_name = model
    response.model_version = version
    if request_id:
        response.id = request_id
    for name in [r.name for r in requested] or list(outputs):
        array = np.asarray(outputs[name])
        out = response.outputs.add()
        out.name = name
        out.datatype = datatype_of(array)
        out.shape.extend(array.shape)
        response.raw_output_contents.append(encode_binary(array))
    return response
