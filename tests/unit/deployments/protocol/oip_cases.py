"""Shared cases for the OIP protocol tests: a model spec, tensors, and ways to build
requests with tritonclient and read responses back with it."""

from __future__ import annotations

import json

import numpy as np
import tritonclient.http as httpclient
from tritonclient.utils import np_to_triton_dtype

from deployments.protocol import (
    INFER_HEADER_LENGTH,
    ModelSpec,
    RequestLimits,
    TensorSpec,
    parse_infer_request,
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


def parse(body: bytes, headers: dict | None = None, spec: ModelSpec = SPEC, limit: int = LIMIT,
          limits: RequestLimits | None = None):
    return parse_infer_request(body, headers or {}, spec, limits or limit)


def decode(body: bytes, headers: dict[str, str]) -> httpclient.InferResult:
    """Read a response the way tritonclient does."""
    length = headers.get(INFER_HEADER_LENGTH)
    return Client.parse_response_body(body, header_length=None if length is None else int(length))


ALL = {"x": X, "ids": IDS, "text": TEXT}


def json_request(**overrides) -> bytes:
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
