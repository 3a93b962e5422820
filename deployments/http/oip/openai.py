"""The OpenAI routes: `/v1/completions`, `/v1/chat/completions`, `/v1/models`.

Each request is one generation through the backend's `generate` / `generate_stream`,
the path `/v2/models/{m}/generate` takes (`deployments.protocol.openai` maps the
fields), so the continuous batcher, the deadline, the priority, the per-client stream
limit and cancel on hang-up are the same. A stream closed by its client closes the
generation's iterator, which cancels it at the batching actor. Errors on these routes
have OpenAI's shape (`OipApp` asks `is_openai_path`).
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

from deployments.http.oip.errors import UnknownModel, error_parts, log_error
from deployments.http.oip.replies import EventStream, Reply, json_reply, unless_gone
from deployments.http.oip.routes import Route
from deployments.protocol.openai import (
    DONE,
    ModelNotFound,
    OpenAIRefusal,
    OpenAIRequest,
    chunk,
    finish_reason,
    models_list,
    openai_request,
    parse_openai_body,
    response,
    text_chunker,
    usage,
)

PREFIX = "/v1/"
STARTED = int(time.time())  # what /v1/models says the models were created at


def is_openai_path(path: str) -> bool:
    return path.startswith(PREFIX)


async def completions(call: Any) -> Reply | EventStream:
    return await _run(call, chat=False)


async def chat_completions(call: Any) -> Reply | EventStream:
    return await _run(call, chat=True)


async def models(call: Any) -> Reply:
    names = [m.name for m in call.backend.models() if m.generative]
    return json_reply(models_list(names, STARTED))


async def _run(call: Any, chat: bool) -> Reply | EventStream:
    doc, name = parse_openai_body(await call.body(), chat)
    try:
        model = call.backend.model(name)
    except UnknownModel:
        raise ModelNotFound(name) from None
    if not model.generative:
        raise OpenAIRefusal(f"the model {name!r} does not generate text: call it with "
                            f"POST /v2/models/{name}/infer", "model", "model_not_generative")
    req = openai_request(doc, name, chat, model.chat_template)
    if not req.stream:
        final = await unless_gone(call.receive, call.backend.generate(model, req.prompt,
                                                                      req.params))
        return json_reply(response(req, final))
    slot = call.app.stream_slot(call.client)  # 429 past the client's limit
    events = None
    try:  # errors before the first event are a proper 4xx/5xx, not an SSE event
        events = call.backend.generate_stream(model, req.prompt, req.params)
        first = await unless_gone(call.receive, events.__anext__())
    except BaseException:
        slot.release()
        if events is not None:
            await events.aclose()
        raise

    async def close() -> None:
        slot.release()
        await events.aclose()

    return EventStream(_chunks(req, first, events), close)


async def _chunks(req: OpenAIRequest, first: dict, rest: AsyncIterator[dict]
                  ) -> AsyncIterator[bytes]:
    """The generation's events as OpenAI chunks, then `[DONE]`; an error after the start
    is an `{"error": {...}}` event (the 200 is sent), which the `openai` package raises."""
    # A chat's role chunk goes out with its first text, and the last chunk, the usage
    # chunk and [DONE] together: one write each, as many writes as OIP's events.
    held = chunk(req, None, None, role=True) if req.chat else b""
    try:
        event, text = first, text_chunker(req)
        while True:
            if event.get("final"):
                use = chunk(req, None, None, usage(event)) if req.include_usage else b""
                yield b"".join((held, chunk(req, None, finish_reason(event)), use, DONE))
                return
            if event["text_output"]:
                yield held + text(event["text_output"]) if held else text(
                    event["text_output"])
                held = b""
            event = await rest.__anext__()
    except StopAsyncIteration:
        return
    except Exception as e:
        status, body, _ = error_parts(e, openai=True)
        log_error(e, status, "POST", "an OpenAI stream, after its first event")
        yield b"data: " + body + b"\n\n"


def openai_routes() -> list[Route]:
    return [Route("POST", "/v1/completions", completions),
            Route("POST", "/v1/chat/completions", chat_completions),
            Route("GET", "/v1/models", models)]
