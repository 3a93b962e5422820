"""The Open Inference Protocol v2 (KServe v2, Triton's HTTP protocol): an infer response,
without HTTP.

Decides what a response looks like: `encode_infer_response` turns output arrays into a
body and headers (JSON, or the binary extension where an output asks for it, as
`tritonclient` reads it: `Inference-Header-Content-Length: N`, N bytes of JSON, then
each binary output's raw bytes in order, its `parameters.binary_data_size` long);
`encode_infer_raw` gives the same as a status, header pairs and body parts for the
servers that write them themselves; `error_body` is every error's `{"error": ...}`.
An output the model did not produce is the model's error (`ModelError`, 500).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import orjson

from batching.errors import ModelError
from deployments.protocol.binary import INFER_HEADER_LENGTH, binary_view
from deployments.protocol.datatypes import datatype_of
from deployments.protocol.jsondata import json_data
from deployments.protocol.request import RequestedOutput

__all__ = ["encode_infer_raw", "encode_infer_response", "error_body"]

_NUMPY = orjson.OPT_SERIALIZE_NUMPY


def encode_infer_response(
    model_name: str,
    model_version: str,
    request_id: str | None,
    outputs: Mapping[str, np.ndarray],
    outputs_requested: list[RequestedOutput] | list[tuple[str, bool]],
    default_binary: bool,
) -> tuple[bytes, dict[str, str]]:
    """The response body and headers for an infer request's `outputs`.

    Returns only `outputs_requested` when it names any, else every output in
    `outputs`, binary when `default_binary`. With any binary output the body is
    the JSON then the raw bytes, and `Inference-Header-Content-Length` is set.

    >>> body, headers = encode_infer_response("m", "1", None, {"y": np.ones(2)}, [], False)
    >>> headers["Content-Type"], body[:22]
    ('application/json', b'{"model_name":"m","mod')
    """
    parts = _encode_parts(model_name, model_version, request_id, outputs, outputs_requested,
                          default_binary)
    if len(parts) == 1:
        return parts[0], {"Content-Type": "application/json"}
    return b"".join(parts), {"Content-Type": "application/octet-stream",
                             INFER_HEADER_LENGTH: str(len(parts[0]))}


_JSON_HEADERS = ((b"content-type", b"application/json"),)
_BINARY_TYPE = (b"content-type", b"application/octet-stream")
_LENGTH_NAME = INFER_HEADER_LENGTH.lower().encode("latin-1")


def encode_infer_raw(
    model_name: str,
    model_version: str,
    request_id: str | None,
    outputs: Mapping[str, np.ndarray],
    outputs_requested: list[RequestedOutput] | list[tuple[str, bool]],
    default_binary: bool,
) -> tuple[list[bytes | memoryview], list[tuple[bytes, bytes]]]:
    """As `encode_infer_response`, with the body in parts (the JSON, then each binary
    output as a view of its array's memory where it can be: no copy, for a server that
    writes them one after another) and the headers as an HTTP server takes them:
    (lowercase name, value) byte pairs."""
    parts = _encode_parts(model_name, model_version, request_id, outputs, outputs_requested,
                          default_binary)
    if len(parts) == 1:
        return parts, list(_JSON_HEADERS)
    return parts, [_BINARY_TYPE, (_LENGTH_NAME, b"%d" % len(parts[0]))]


def _encode_parts(
    model_name: str,
    model_version: str,
    request_id: str | None,
    outputs: Mapping[str, np.ndarray],
    outputs_requested: list[RequestedOutput] | list[tuple[str, bool]],
    default_binary: bool,
) -> list[bytes | memoryview]:
    """The JSON, then every binary output (in the order of their entries)."""
    selected = outputs_requested or [RequestedOutput(n, default_binary) for n in outputs]
    chunks: list[bytes | memoryview] = []  # binary outputs, in the order of their entries
    entries = [_output_entry(name, binary, outputs, chunks) for name, binary in selected]
    doc: dict[str, Any] = {"model_name": model_name, "model_version": model_version}
    if request_id:
        doc["id"] = request_id
    doc["outputs"] = entries
    chunks.insert(0, orjson.dumps(doc, option=_NUMPY))
    return chunks


def _output_entry(
    name: str, binary: bool, outputs: Mapping[str, np.ndarray], chunks: list
) -> dict[str, Any]:
    if name not in outputs:
        raise ModelError(
            f"the model returned outputs {list(outputs)} but not '{name}', which the "
            "request asked for; the model must return every output it declares"
        )
    array = outputs[name]
    if type(array) is not np.ndarray:
        array = np.asarray(array)
    datatype = datatype_of(array)
    entry: dict[str, Any] = {"name": name, "datatype": datatype, "shape": list(array.shape)}
    if binary:
        raw = binary_view(array, datatype)
        entry["parameters"] = {"binary_data_size": len(raw)}
        chunks.append(raw)
    else:
        entry["data"] = json_data(array, name)
    return entry


def error_body(message: str) -> bytes:
    """The OIP error body: `{"error": message}`."""
    return orjson.dumps({"error": message})
