"""The Open Inference Protocol v2 (KServe v2, Triton's HTTP protocol): an infer request,
without HTTP.

Decides what an infer request means, so the servers only move bytes and headers:
`parse_infer_request` turns a body and its headers into arrays checked against the
model's `ModelSpec` (its answer: `deployments.protocol.response`). Triton's
`tritonclient.http` must work unchanged, so its conventions are followed to the
letter (see `deployments.protocol.binary` for the byte layouts):

- binary tensor data: header `Inference-Header-Content-Length: N`, the first N
  bytes are JSON, the rest are the inputs' raw bytes in input order, each
  input's `parameters.binary_data_size` long. Responses do the same.
- request parameters: `priority` (uint, 0 = default level, 1 = highest),
  `timeout` (uint MICROseconds, 0 = none), `sequence_id` (uint or string, 0 or
  "" = none), `sequence_start` / `sequence_end` (bool), `binary_data_output`
  (bool: the default for outputs that do not say). Keys starting `triton_` are
  reserved; other keys pass through as custom parameters.
- an output asks for binary with `parameters.binary_data`; with no `outputs`
  listed, every output is returned (tritonclient then sends
  `binary_data_output: true`).

Invariant: everything wrong with a request raises `InvalidRequest` (HTTP 400,
or `PayloadTooLarge`, 413) whose message says what was wrong and how to fix it,
before any array reaches the engine. Unknown models are the ingress's 404.
"""

from __future__ import annotations

import zlib
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np
import orjson

from batching.errors import InvalidRequest
from deployments.protocol import plans
from deployments.protocol.binary import (
    DEFAULT_LIMITS,
    INFER_HEADER_LENGTH,
    PayloadTooLarge,
    batch_size_of,
    is_uint,
    read_inputs,
)
from deployments.protocol.jsondata import past_64_bits
from deployments.protocol.limits import RequestLimits, shown
from deployments.protocol.metadata import ModelSpec

__all__ = [
    "InferRequest",
    "LowerHeaders",
    "PayloadTooLarge",
    "RequestedOutput",
    "check_content_length",
    "load_json",
    "parse_infer_request",
]

_RESERVED_PREFIX = "triton_"


class RequestedOutput(NamedTuple):
    """An output the client asked for, and whether it wants it as binary data."""

    name: str
    binary: bool


@dataclass(frozen=True, slots=True)
class InferRequest:
    """A parsed, validated infer request.

    `parameters` holds every request-level parameter as sent (custom ones too);
    the properties read Triton's reserved ones in Raybatch's units.
    `batch_size` is the shared leading dim when the model batches, else None.
    An empty `outputs_requested` means: return every output, binary if
    `binary_data_output`.
    """

    id: str | None
    inputs: dict[str, np.ndarray]
    parameters: dict[str, Any]
    outputs_requested: list[RequestedOutput]
    batch_size: int | None = None

    @property
    def priority(self) -> int | None:
        """1 = highest; None when absent or 0 (the model's default level)."""
        return self.parameters.get("priority") or None

    @property
    def timeout_s(self) -> float | None:
        """The `timeout` parameter (microseconds on the wire) in seconds; None if 0 or absent."""
        timeout_us = self.parameters.get("timeout")
        return timeout_us / 1e6 if timeout_us else None

    @property
    def sequence_id(self) -> int | str | None:
        """The correlation id; None when absent, 0 or "" (not part of a sequence)."""
        return self.parameters.get("sequence_id") or None

    @property
    def sequence_start(self) -> bool:
        return bool(self.parameters.get("sequence_start", False))

    @property
    def sequence_end(self) -> bool:
        return bool(self.parameters.get("sequence_end", False))

    @property
    def binary_data_output(self) -> bool:
        return bool(self.parameters.get("binary_data_output", False))


def check_content_length(headers: Mapping[str, str], max_body_bytes: int) -> None:
    """Raise `PayloadTooLarge` from the Content-Length header alone, before reading the body."""
    declared = _header(headers, "content-length")
    if declared is not None and _is_digits(declared) and _uint(declared) > max_body_bytes:
        raise _too_large(_uint(declared), max_body_bytes)


def _is_digits(text: str) -> bool:
    """ASCII digits only: `str.isdigit` also accepts '²', which `int` refuses."""
    return text.isascii() and text.isdigit()


def _uint(digits: str) -> int:
    """`digits` (ASCII digits) as an int, past 2**63 capped there: `int` refuses strings of
    over 4,300 digits (ValueError), and no length this server compares it with is near."""
    digits = digits.lstrip("0") or "0"
    return int(digits) if len(digits) <= 19 else 2**63


def parse_infer_request(
    body: bytes, headers: Mapping[str, str], spec: ModelSpec,
    limits: RequestLimits | int = DEFAULT_LIMITS, remember: bool = False,
) -> InferRequest:
    """Parse and validate `POST /v2/models/{name}/infer` against `spec`; `limits` (or
    just the body limit, in bytes) bound what it may carry. `remember`: decode a binary
    request whose JSON header was seen before from that header's plan, and remember new
    ones (`deployments.protocol.plans`); the outcome is the same either way.

    >>> spec = ModelSpec("m", inputs=[TensorSpec("x", "INT32", [-1])],
    ...                  outputs=[TensorSpec("y", "INT32", [-1])], max_batch_size=4)
    >>> body = b'{"inputs": [{"name": "x", "datatype": "INT32", "shape": [2], "data": [1, 2]}]}'
    >>> parse_infer_request(body, {}, spec, 1 << 20).inputs["x"].tolist()
    [1, 2]
    """
    if isinstance(limits, int):
        limits = RequestLimits(max_body_bytes=limits)
    if len(body) > limits.max_body_bytes:
        raise _too_large(len(body), limits.max_body_bytes)
    body = _decompress(body, _header(headers, "content-encoding"), limits.max_body_bytes)
    json_length = _json_length(headers, len(body))
    view = memoryview(body)
    header = None
    if remember and json_length is not None and json_length <= plans.MAX_HEADER_BYTES:
        header = bytes(view[:json_length])
        plan = spec.plans.get(header)
        if (plan is not None and (plan.limits is limits or plan.limits == limits)
                and len(body) - json_length == plan.binary_size):
            return InferRequest(plan.request_id, plan.inputs_of(view[json_length:]),
                                dict(plan.parameters), list(plan.outputs), plan.batch_size)
    doc = load_json(view if json_length is None else view[:json_length], binary_hint=True)
    if not isinstance(doc, dict):
        raise InvalidRequest(
            f"the request JSON must be an object with 'inputs', got {type(doc).__name__}"
        )
    parameters = _request_parameters(doc.get("parameters"))
    binary = view[json_length:] if json_length is not None else None
    inputs = read_inputs(doc.get("inputs"), binary, spec, limits)
    outputs = _requested_outputs(
        doc.get("outputs"), spec, bool(parameters.get("binary_data_output", False))
    )
    request_id = doc.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise InvalidRequest(f"'id' must be a JSON string, got {shown(request_id)}")
    request = InferRequest(request_id, inputs, parameters, outputs, batch_size_of(inputs, spec))
    if header is not None:
        plans.remember(spec.plans, header, plans.make_plan(
            doc, inputs, len(body) - len(header), limits, request))
    return request


class LowerHeaders(dict):
    """Headers whose names are all lowercase already (what a server hands over): looked
    up once, not searched again in other casings."""


def _header(headers: Mapping[str, str], lower_name: str) -> str | None:
    value = headers.get(lower_name)
    if value is None and type(headers) is not LowerHeaders:  # a dict in other casing
        value = next((v for k, v in headers.items() if k.lower() == lower_name), None)
    return None if value is None else str(value).strip()


def _too_large(size: int, limit: int) -> PayloadTooLarge:
    return PayloadTooLarge(
        f"the request body is {size} bytes, more than this server's limit of {limit}; "
        "send fewer items per request"
    )


def _decompress(body: bytes, encoding: str | None, max_body_bytes: int) -> bytes:
    """Undo `Content-Encoding: gzip|deflate` (tritonclient's request compression)."""
    encoding = (encoding or "identity").lower()
    if encoding == "identity":
        return body
    wbits = {"gzip": 16 + zlib.MAX_WBITS, "deflate": zlib.MAX_WBITS}.get(encoding)
    if wbits is None:
        raise InvalidRequest(
            f"Content-Encoding {shown(encoding)} is not supported; use gzip, deflate or none"
        )
    inflater = zlib.decompressobj(wbits)
    try:
        # Bounded: a small compressed body must not inflate past the limit.
        out = inflater.decompress(body, max_body_bytes + 1)
    except zlib.error as exc:
        raise InvalidRequest(f"the body is not valid {encoding} data ({exc})") from None
    if len(out) > max_body_bytes or inflater.unconsumed_tail:
        raise _too_large(max(len(out), max_body_bytes + 1), max_body_bytes)
    if not inflater.eof:
        raise InvalidRequest(f"the {encoding} body is truncated; send the whole stream")
    return out


def _json_length(headers: Mapping[str, str], body_size: int) -> int | None:
    """The JSON header's length from `Inference-Header-Content-Length`; None if absent."""
    raw = _header(headers, INFER_HEADER_LENGTH.lower())
    if raw is None:
        return None
    if not _is_digits(raw):
        raise InvalidRequest(
            f"{INFER_HEADER_LENGTH} must be a non-negative integer, got {shown(raw)}"
        )
    length = _uint(raw)
    if length == 0 or length > body_size:
        raise InvalidRequest(
            f"{INFER_HEADER_LENGTH} is {shown(raw)} but must be between 1 and the body's "
            f"{body_size} bytes: the length of the JSON that starts the body"
        )
    return length


def load_json(raw: bytes | memoryview, binary_hint: bool = False) -> Any:
    """Strict JSON (RFC 8259, via orjson): NaN, Infinity, numbers that overflow a double
    (1e999, a 5,000-digit integer) and nesting past 1,024 levels are refused with a 400
    that says so, as is text that is not UTF-8."""
    try:
        return orjson.loads(raw)
    except orjson.JSONDecodeError as exc:
        if not _is_utf8(raw):
            hint = (f"; if the body carries binary tensors, set {INFER_HEADER_LENGTH} to "
                    "the length of its JSON part") if binary_hint else ""
            raise InvalidRequest(f"the request body is not valid JSON: it is not UTF-8{hint}"
                                 ) from None
        raise InvalidRequest(
            f"the request body is not valid JSON: {exc}. Numbers must be finite and fit a "
            "double (no NaN or Infinity; integers up to 64 bits)"
        ) from None


def _is_utf8(raw: bytes | memoryview) -> bool:
    try:
        bytes(raw).decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True


def _shown_param(value: Any) -> str:
    """A parameter's value as the client sent it: an integer past 64 bits as what it is,
    not as the float it was read as."""
    if past_64_bits(value) and abs(value) < 1e30:  # larger: likely sent as a float, as shown
        return f"an integer past 64 bits ({int(value)})"
    return shown(value)


def _request_parameters(raw: Any) -> dict[str, Any]:
    """Check Triton's reserved request parameters; custom ones pass through as sent."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise InvalidRequest(f"'parameters' must be a JSON object, got {shown(raw)}")
    for key, value in raw.items():
        if key.startswith(_RESERVED_PREFIX):
            raise InvalidRequest(
                f"parameter '{key}': keys starting with '{_RESERVED_PREFIX}' are reserved"
            )
        if key in ("priority", "timeout") and not is_uint(value):
            unit = " in microseconds" if key == "timeout" else " (1 = highest, 0 = default)"
            raise InvalidRequest(
                f"parameter '{key}' must be a non-negative integer{unit}, got "
                f"{_shown_param(value)}"
            )
        if key == "sequence_id" and not (is_uint(value) or isinstance(value, str)):
            hint = "; send a larger id as a string" if past_64_bits(value) and value > 0 else ""
            raise InvalidRequest(
                "parameter 'sequence_id' must be a non-negative integer or a string, got "
                f"{_shown_param(value)}{hint}"
            )
        if key in ("sequence_start", "sequence_end", "binary_data_output") and not isinstance(
            value, bool
        ):
            raise InvalidRequest(f"parameter '{key}' must be true or false, got {shown(value)}")
    return dict(raw)


def _requested_outputs(raw: Any, spec: ModelSpec, default_binary: bool) -> list[RequestedOutput]:
    """The outputs asked for, each binary or not; [] means all of them."""
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise InvalidRequest(f"'outputs' must be a JSON array, got {shown(raw)}")
    requested: list[RequestedOutput] = []
    for index, entry in enumerate(raw):
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise InvalidRequest(f"outputs[{index}] must be an object with a string 'name'")
        name = entry["name"]
        if name not in spec.output_names:
            raise InvalidRequest(
                f"model '{spec.name}' has no output {shown(name)}; its outputs are "
                f"{list(spec.output_names)}"
            )
        if any(r.name == name for r in requested):
            raise InvalidRequest(f"output '{name}' is requested twice; name each output once")
        params = entry.get("parameters")
        params = {} if params is None else params
        if not isinstance(params, dict):
            raise InvalidRequest(f"output '{name}': 'parameters' must be a JSON object")
        for unsupported in ("classification", "shared_memory_region"):
            if unsupported in params:
                raise InvalidRequest(
                    f"output '{name}' asks for {unsupported}, which Raybatch does not "
                    "support; request the plain tensor"
                )
        binary = params.get("binary_data", default_binary)
        if not isinstance(binary, bool):
            raise InvalidRequest(
                f"output '{name}': binary_data must be true or false, got {shown(binary)}"
            )
        requested.append(RequestedOutput(name, binary))
    return requested
