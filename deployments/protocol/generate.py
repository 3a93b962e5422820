"""The Open Inference Protocol's generate extension: request bodies, responses, SSE events.

`POST /v2/models/{m}/generate` takes `{"text_input": "...", "parameters":
{"max_tokens": 32, "stop": ["\\n"]}}` (as Triton's generate extension; the
parameters may also be given at the top level, as Triton maps top-level fields
to the model's inputs) and answers one JSON object with the whole
`text_output`. `generate_stream` answers server-sent events: one `data:` event
per step with that step's new text, then a final event with the finish reason
and token counts, then the stream closes. An error after the stream started is
an event `{"error": "..."}` (the status line is already sent), as Triton does.
"""

from __future__ import annotations

from typing import Any

import orjson

from batching.errors import InvalidRequest
from deployments.protocol.limits import shown
from deployments.protocol.request import load_json

TOP_LEVEL = ("id", "text_input", "parameters")
_SCALARS = (str, int, float, bool, type(None))


def parse_generate_body(body: bytes) -> tuple[str | None, Any, dict[str, Any]]:
    """(request id, text_input, parameters) of a generate request body.

    Strict JSON as for infer; a parameter's value is a scalar or a flat list of them
    (the model checks which parameters it takes).

    >>> parse_generate_body(b'{"text_input": "hi", "max_tokens": 3}')
    (None, 'hi', {'max_tokens': 3})
    """
    doc = load_json(body)
    if not isinstance(doc, dict):
        raise InvalidRequest("the request body must be a JSON object with 'text_input'")
    if "text_input" not in doc:
        raise InvalidRequest("the request needs 'text_input', the prompt (a string)")
    params = doc.get("parameters", {})
    if not isinstance(params, dict):
        raise InvalidRequest(f"'parameters' must be a JSON object, got {shown(params)}")
    extra = {k: v for k, v in doc.items() if k not in TOP_LEVEL}
    both = sorted(set(extra) & set(params))
    if both:
        raise InvalidRequest(f"{shown(both)} given both at the top level and in 'parameters': "
                             "give each once")
    request_id = doc.get("id")
    if request_id is not None and not isinstance(request_id, str):
        raise InvalidRequest(f"'id' must be a string, got {shown(request_id)}")
    params = {**params, **extra}
    for key, value in params.items():
        _check_parameter(key, value)
    return request_id, doc["text_input"], params


def _check_parameter(key: str, value: Any) -> None:
    if isinstance(value, _SCALARS):
        return
    if isinstance(value, list) and all(isinstance(v, _SCALARS) for v in value):
        return
    raise InvalidRequest(f"parameter {shown(key)} must be a string, number, true/false or a "
                         f"flat list of them, got {shown(value)}")


def generate_response(model: str, version: str, request_id: str | None,
                      event: dict[str, Any]) -> dict[str, Any]:
    """The JSON of a generate response, or of one streamed event."""
    out: dict[str, Any] = {"model_name": model, "model_version": version}
    if request_id is not None:
        out["id"] = request_id
    out.update(event)
    return out


def sse_event(doc: dict[str, Any]) -> bytes:
    """One server-sent event carrying `doc` as JSON."""
    return b"data: " + orjson.dumps(doc) + b"\n\n"
