"""Tensor data of the Open Inference Protocol: datatypes, byte layouts, a request's inputs.

Decides how a tensor travels as bytes: how the binary tensor data extension lays
tensors out after the JSON header (little-endian, row-major; BYTES as a 4-byte
little-endian length before each element, exactly what
`tritonclient.utils.serialize_byte_tensor` writes), and how a request's inputs, JSON
(`deployments.protocol.jsondata`) or binary, are read. Pure: no web framework, no Ray.

Invariant: a decoded array has exactly the element count its shape promises, or
`InvalidRequest` is raised with a message naming the tensor and the fix. Sizes are
checked against `RequestLimits` from the shapes, before any array is allocated. BYTES
tensors are always object arrays of `bytes`. Arrays decoded from binary data are
read-only views of the request body (no copy); copy them before writing in place, and
outputs go out as views of their arrays (`binary_view`) where they can.
`read_inputs` checks each input against the model's `TensorSpec` (name, datatype,
rank, fixed dims) and consumes the binary section exactly, in input order.
"""

from __future__ import annotations

import math
import struct
import sys
from collections.abc import Sequence
from typing import Any

import numpy as np

from batching.errors import InvalidRequest
from deployments.protocol.datatypes import (
    NUMPY_DTYPES,
    as_bytes_list,
    check_datatype,
    datatype_of,
)
from deployments.protocol.jsondata import decode_json_data
from deployments.protocol.limits import RequestLimits, shown
from deployments.protocol.metadata import ModelSpec, TensorSpec
from deployments.protocol.wording import unexpected_input, unexpected_shape, wrong_datatype

DEFAULT_LIMITS = RequestLimits()


class PayloadTooLarge(InvalidRequest):
    """The request (its body after decompression, or its tensors) is larger than the
    server accepts."""

    http_status = 413


INFER_HEADER_LENGTH = "Inference-Header-Content-Length"

_LEN = struct.Struct("<I")
_LITTLE = ("<", "|") if sys.byteorder == "big" else ("<", "|", "=")


def num_elements(shape: Sequence[int]) -> int:
    """Element count of a shape; 1 for a scalar's empty shape."""
    return math.prod(shape)


# No array has dims whose product passes this, zero dims aside (numpy refuses to make one
# whose size in bytes, were its zero dims not there, would pass its index type).
MAX_DIMS_PRODUCT = 2**60


def check_dims(shape: Sequence[int], where: str) -> None:
    """Refuse a request's shape that no array can have. Only a shape with a zero dim passes
    the size limits so (its element count is 0): [0, 2**62] holds nothing, but numpy
    cannot shape even an empty array so. Any other shape is left to the size limits (a
    413 that says how much fits), and costs one scan for a zero here."""
    if 0 in shape and math.prod(d for d in shape if d) > MAX_DIMS_PRODUCT:
        raise InvalidRequest(f"{where} has shape {shown(list(shape))}: its dims multiply past "
                             "what an array can hold; give the actual size of every dim")


def decode_binary(raw: memoryview, datatype: str, shape: Sequence[int], where: str) -> np.ndarray:
    """A tensor from its bytes in the binary extension; `raw` is exactly its `binary_data_size`."""
    expected = num_elements(shape)
    if datatype == "BYTES":
        return decode_bytes_elements(raw, expected, where).reshape(shape)
    dtype = NUMPY_DTYPES[datatype]
    if len(raw) != expected * dtype.itemsize:
        raise InvalidRequest(
            f"{where}: binary_data_size is {len(raw)} bytes but shape {list(shape)} of "
            f"{datatype} needs {expected} x {dtype.itemsize} = {expected * dtype.itemsize}"
        )
    return np.frombuffer(raw, dtype=dtype).reshape(shape)


def decode_bytes_elements(raw: memoryview, count: int, where: str) -> np.ndarray:
    """`count` BYTES elements, each a 4-byte little-endian length and then its bytes."""
    # A list, not np.empty(count): `count` is the client's number; the bytes bound the list.
    out: list[bytes] = []
    offset, size = 0, len(raw)
    for i in range(count):
        if offset + 4 > size:
            raise InvalidRequest(
                f"{where}: the binary BYTES data ends after {i} of {count} elements; "
                "each element is a 4-byte little-endian length followed by that many bytes"
            )
        (length,) = _LEN.unpack_from(raw, offset)
        if offset + 4 + length > size:
            raise InvalidRequest(
                f"{where}: BYTES element {i} claims {length} bytes but only "
                f"{size - offset - 4} remain within its binary_data_size"
            )
        out.append(bytes(raw[offset + 4 : offset + 4 + length]))
        offset += 4 + length
    if offset != size:
        raise InvalidRequest(
            f"{where}: {size - offset} bytes are left over after the {count} BYTES "
            f"elements the shape asks for; binary_data_size must cover exactly those elements"
        )
    array = np.empty(len(out), dtype=object)
    array[:] = out
    return array


def encode_binary(array: np.ndarray) -> bytes:
    """The bytes the binary extension carries for `array` (row-major, little-endian)."""
    return bytes(binary_view(array))


def binary_view(array: np.ndarray, datatype: str | None = None) -> memoryview | bytes:
    """What the binary extension carries for `array` (of OIP `datatype`, if known): a view
    of its own memory when it is already contiguous and little-endian (no copy), else a
    copy; BYTES are serialized."""
    if (datatype or datatype_of(array)) == "BYTES":
        return b"".join(_LEN.pack(len(b)) + b for b in as_bytes_list(array))
    if array.size and array.flags.c_contiguous and array.dtype.byteorder in _LITTLE:
        return memoryview(array).cast("B")  # the array's own memory
    little = np.ascontiguousarray(array.astype(array.dtype.newbyteorder("<"), copy=False))
    return little.reshape(-1).view(np.uint8).data


def is_uint(value: Any) -> bool:
    """A JSON non-negative integer (JSON true/false are not integers here)."""
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def is_seconds(value: Any) -> bool:
    """A finite non-negative number of seconds (true/false are not numbers here; nor is an
    integer too large for a float, which a deadline's arithmetic could not hold)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        return False
    try:
        return 0 <= float(value) < math.inf
    except OverflowError:
        return False


def read_inputs(entries: Any, binary: memoryview | None, spec: ModelSpec,
                limits: RequestLimits = DEFAULT_LIMITS) -> dict[str, np.ndarray]:
    """Decode every input in order, taking binary ones from `binary` one after another.
    Each input's size is checked against `limits` from its shape, before decoding it."""
    if not isinstance(entries, list) or not entries:
        raise InvalidRequest(
            f"the request needs a non-empty 'inputs' array; model '{spec.name}' takes "
            f"{list(spec.input_names)}"
        )
    specs = spec.input_by_name
    arrays: dict[str, np.ndarray] = {}
    offset = elements = 0
    for index, entry in enumerate(entries):
        name, datatype, shape, params = _input_header(entry, index, specs, spec)
        if name in arrays:
            raise InvalidRequest(f"input '{name}' appears twice; send each input once")
        where = f"input '{name}'"
        elements += num_elements(shape)
        _check_size(where, shape, elements, spec, limits)
        if "binary_data_size" in params:
            raw = _binary_slice(params["binary_data_size"], where, binary, offset)
            arrays[name] = decode_binary(raw, datatype, shape, where)
            offset += len(raw)
        elif "data" in entry:
            arrays[name] = decode_json_data(entry["data"], datatype, shape, where)
        else:
            raise InvalidRequest(
                f"{where} carries no data: give 'data' in the JSON, or "
                f"parameters.binary_data_size with the bytes after the JSON header"
            )
    _check_all_given(arrays, spec)
    if binary is not None and offset != len(binary):
        raise InvalidRequest(
            f"{len(binary) - offset} bytes after the JSON header belong to no input: the "
            f"inputs' binary_data_size add up to {offset} of the {len(binary)} sent"
        )
    return arrays


def _input_header(
    entry: Any, index: int, specs: dict[str, TensorSpec], spec: ModelSpec
) -> tuple[str, str, list[int], dict[str, Any]]:
    """Name, datatype, shape and parameters of one input, checked against the model."""
    if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
        raise InvalidRequest(f"inputs[{index}] must be an object with a string 'name'")
    name = entry["name"]
    tensor = specs.get(name)
    if tensor is None:
        raise InvalidRequest(unexpected_input(name, spec.name, spec.input_names))
    where = f"input '{name}'"
    datatype = check_datatype(entry.get("datatype"), where)
    if datatype != tensor.datatype:
        raise InvalidRequest(wrong_datatype(name, datatype, spec.name, tensor.datatype))
    shape = _check_shape(entry.get("shape"), tensor, where, spec.name)
    params = entry.get("parameters")
    params = {} if params is None else params
    if not isinstance(params, dict):
        raise InvalidRequest(f"{where}: 'parameters' must be a JSON object, got {shown(params)}")
    if "shared_memory_region" in params:
        raise InvalidRequest(
            f"{where} uses shared memory, which Raybatch does not support; send the data "
            "in the body (JSON 'data' or binary tensor data)"
        )
    return name, datatype, shape, params


def _check_shape(shape: Any, tensor: TensorSpec, where: str, model: str) -> list[int]:
    if not isinstance(shape, list) or not all(
        isinstance(d, int) and not isinstance(d, bool) for d in shape
    ):
        raise InvalidRequest(f"{where}: 'shape' must be an array of integers, got {shown(shape)}")
    if any(d < 0 for d in shape):
        raise InvalidRequest(
            f"{where} has shape {shown(shape)} with a negative dim; a request gives the actual "
            "size of every dim (-1 is only for model metadata)"
        )
    check_dims(shape, where)
    expected = tensor.shape
    if len(shape) != len(expected) or any(
            want not in (-1, got) for got, want in zip(shape, expected)):
        raise InvalidRequest(unexpected_shape(tensor.name, model, expected, shape))
    return shape


def _check_size(where: str, shape: list[int], elements: int, spec: ModelSpec,
                limits: RequestLimits) -> None:
    """Refuse a request too large to decode, from its shapes alone (nothing allocated yet)."""
    if spec.max_batch_size > 0 and shape and shape[0] > limits.max_items:
        raise PayloadTooLarge(
            f"{where} carries {shape[0]} items (its leading dim), more than this server's "
            f"limit of {limits.max_items} per request; send them in several requests"
        )
    if elements > limits.max_elements:
        raise PayloadTooLarge(
            f"the inputs hold {elements} elements (up to {where}), more than this server's "
            f"limit of {limits.max_elements} per request; send fewer items per request"
        )


def _binary_slice(size: Any, where: str, binary: memoryview | None, offset: int) -> memoryview:
    """The `size` bytes of one input, which start `offset` bytes after the JSON header."""
    if not is_uint(size):
        raise InvalidRequest(
            f"{where}: binary_data_size must be a non-negative integer, got {shown(size)}"
        )
    if binary is None:
        raise InvalidRequest(
            f"{where} sets binary_data_size but the request has no {INFER_HEADER_LENGTH} "
            "header; set it to the length of the JSON part of the body"
        )
    if offset + size > len(binary):
        raise InvalidRequest(
            f"{where}: binary_data_size={size} at byte {offset} runs past the "
            f"{len(binary)} bytes after the JSON header; the sizes must add up to them"
        )
    return binary[offset : offset + size]


def _check_all_given(arrays: dict[str, np.ndarray], spec: ModelSpec) -> None:
    missing = [n for n in spec.input_names if n not in arrays]
    if missing:
        raise InvalidRequest(
            f"model '{spec.name}' needs inputs {missing} too; it takes {list(spec.input_names)}"
        )


def batch_size_of(inputs: dict[str, np.ndarray], spec: ModelSpec) -> int | None:
    """The leading dim all inputs share when the model batches; None when it does not."""
    if spec.max_batch_size == 0:
        return None
    sizes = {name: array.shape[0] for name, array in inputs.items()}
    if len(set(sizes.values())) > 1:
        raise InvalidRequest(
            f"the inputs disagree on the batch size (leading dim): {sizes}; every input "
            "of a request must carry the same number of items"
        )
    size = next(iter(sizes.values()))
    if size == 0:
        raise InvalidRequest("the batch dim (leading dim) is 0; send at least one item")
    return size
