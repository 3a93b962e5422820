"""The Open Inference Protocol's routes: one table, and a few lines per handler.

Each handler takes the request's `Call` (its path parameters, the few headers the
protocol reads, a way to read the body within the limits) and returns a `Reply`
or an `EventStream`; it raises for anything wrong, and the app turns the error
into `{"error": ...}`. Parsing and encoding are the codec's
(`deployments.protocol`); running is the backend's.

Every model route also answers under `/versions/{version}`, as Triton's do.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable
from typing import Any

from deployments.http.oip.errors import Unavailable, error_parts, log_error
from deployments.http.oip.replies import EventStream, Reply, json_reply, unless_gone
from deployments.http.oip.routes import Route
from deployments.protocol import (
    encode_infer_raw,
    generate_response,
    metadata_json,
    model_config_json,
    parse_generate_body,
    parse_infer_request,
    read_index_request,
    repository_index_json,
    sse_event,
)

OK = Reply(200)


async def live(call: Any) -> Reply:
    return OK


async def server_ready(call: Any) -> Reply:
    models = call.backend.models()
    ready = await asyncio.gather(*(call.backend.ready(m) for m in models))
    not_ready = [m.name for m, ok in zip(models, ready) if not ok]
    if not_ready:
        raise Unavailable(f"models {not_ready} are not ready yet; retry shortly")
    return OK


async def server_metadata(call: Any) -> Reply:
    return call.app.metadata_reply


async def all_stats(call: Any) -> Reply:
    stats = [await call.backend.stats(m) for m in call.backend.models()]
    return json_reply({"model_stats": stats})


async def repository_index(call: Any) -> Reply:
    """Triton's repository index (the `model_repository` extension's read side)."""
    ready_only = read_index_request(await call.body())
    models = call.backend.models()
    ready = await asyncio.gather(*(call.backend.ready(m) for m in models))
    return json_reply(repository_index_json(
        ((m.name, m.version, ok) for m, ok in zip(models, ready)), ready_only))


async def model_metadata(call: Any) -> Reply:
    return json_reply(metadata_json(call.model().spec))


async def model_config(call: Any) -> Reply:
    return json_reply(model_config_json(call.model().spec))


async def model_ready(call: Any) -> Reply:
    model = call.model()
    if not await call.backend.ready(model):
        raise Unavailable(f"model {model.name!r} is not ready yet; retry shortly")
    return OK


async def model_stats(call: Any) -> Reply:
    return json_reply({"model_stats": [await call.backend.stats(call.model())]})


async def infer(call: Any) -> Reply:
    model = call.model()
    request = parse_infer_request(await call.body(), call.headers, model.spec,
                                  call.app.request_limits, remember=True)
    outputs = await call.backend.infer(model, request, call.received_s)
    parts, headers = encode_infer_raw(model.name, model.version, request.id, outputs,
                                      request.outputs_requested, request.binary_data_output)
    return Reply(200, parts, headers)


async def generate(call: Any) -> Reply:
    model = call.model()
    request_id, text, params = parse_generate_body(await call.body())
    final = await unless_gone(call.receive, call.backend.generate(model, text, params))
    return json_reply(generate_response(model.name, model.version, request_id, final))


async def generate_stream(call: Any) -> EventStream:
    model = call.model()
    request_id, text, params = parse_generate_body(await call.body())
    slot = call.app.stream_slot(call.client)  # 429 past the client's limit
    events = None
    try:  # errors before the first event are a proper 4xx/5xx, not an SSE event
        events = call.backend.generate_stream(model, text, params)
        first = await unless_gone(call.receive, events.__anext__())
    except BaseException:
        slot.release()
        if events is not None:
            await events.aclose()  # type: ignore[attr-defined]
        raise
    wrap = _wrapper(model.name, model.version, request_id)

    async def close() -> None:
        slot.release()
        await events.aclose()  # type: ignore[attr-defined]

    return EventStream(_sse(first, events, wrap), close)


def _wrapper(name: str, version: str, request_id: str | None) -> Callable[[dict], bytes]:
    return lambda event: sse_event(generate_response(name, version, request_id, event))


async def _sse(first: dict, rest: Any, wrap: Callable[[dict], bytes]) -> AsyncIterator[bytes]:
    """The events, encoded; an error after the start is an `{"error"}` event (the 200
    is already sent)."""
    try:
        yield wrap(first)
        async for event in rest:
            yield wrap(event)
    except Exception as e:
        status, body, _ = error_parts(e)
        log_error(e, status, "POST", "a generate_stream, after its first event")
        yield b"data: " + body + b"\n\n"


def _model_routes(method: str, suffix: str, handler: Callable[..., Any]) -> list[Route]:
    return [Route(method, f"/v2/models/{{model}}{suffix}", handler),
            Route(method, f"/v2/models/{{model}}/versions/{{version}}{suffix}", handler)]


def oip_routes() -> list[Route]:
    """The table: every route the front serves."""
    return [
        Route("GET", "/v2", server_metadata),
        Route("GET", "/v2/health/live", live),
        Route("GET", "/v2/health/ready", server_ready),
        Route("GET", "/v2/models/stats", all_stats),  # a fixed path: matched before {model}
        Route("POST", "/v2/repository/index", repository_index),
        *_model_routes("GET", "", model_metadata),
        *_model_routes("GET", "/config", model_config),
        *_model_routes("GET", "/ready", model_ready),
        *_model_routes("GET", "/stats", model_stats),
        *_model_routes("POST", "/infer", infer),
        *_model_routes("POST", "/generate", generate),
        *_model_routes("POST", "/generate_stream", generate_stream),
    ]
