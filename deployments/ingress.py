"""The Serve ingress: the Open Inference Protocol over HTTP, and the handle API.

It parses (a clear 4xx for anything wrong) and hands each request to the
model's `ModelRoute`, which checks it against the model's tensors, gives it its
deadline, and coalesces what arrived in the same loop tick into bundles of one
batch's worth for the least-loaded batching actor, which batches across all
ingress replicas; or, for a model with `batcher.placement: ingress`, submits it
to the engine running in this replica (`deployments.backends`).

Errors map to status codes in one place (`_error_response`), from the
`http_status` of the exception classes. The protocol codec is
`deployments.protocol.infer`; this module only moves bytes, headers and arrays.
"""


import asyncio
import logging
from typing import Any

import numpy as np
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from ray import serve

from batching.errors import RaybatchError, http_status
from cluster.config import ModelConfig, RaybatchConfig
from deployments.backends import make_backend
from deployments.protocol import (
    ModelSpec,
    TensorSpec,
    check_content_length,
    encode_infer_response,
    error_body,
    generate_response,
    metadata_json,
    model_config_json,
    parse_generate_body,
    parse_infer_request,
    server_metadata_json,
    sse_event,
)
from deployments.stats import model_counters_json

log = logging.getLogger(__name__)
api = FastAPI(title="Raybatch", docs_url=None, redoc_url=None)


class UnknownModel(RaybatchError):
    http_status = 404


def model_spec(m: ModelConfig) -> ModelSpec:
    return ModelSpec(
        m.name, m.version, "raybatch",
        inputs=[TensorSpec(t.name, t.datatype, t.shape) for t in m.inputs],
        outputs=[TensorSpec(t.name, t.datatype, t.shape) for t in m.outputs],
        max_batch_size=batch_limit(m),
    )


def batch_limit(m: ModelConfig) -> int:
    """Most requests one batch (or generation step) of `m` carries."""
    policy = m.batching
    return getattr(policy, "max_batch_size", None) or policy.max_active


class _Model:
    def __init__(self, config: ModelConfig, default_timeout_s: float | None,
                 ingress_replicas: int) -> None:
        self.config = config
        self.spec = model_spec(config)
        # Where the engine runs (batcher.placement): batching actors, or this replica.
        self.backend = make_backend(config, default_timeout_s, ingress_replicas,
                                    serve.get_deployment_actor)
        self.route = self.backend.route


# Defined before the class: @serve.ingress copies the module globals it sees at decoration.
def _error_response(e: Exception) -> Response:
    status = http_status(e)
    if status >= 500 and not isinstance(e, RaybatchError):
        log.exception("request failed")
    headers = {"Retry-After": "1"} if status in (429, 503) else {}
    message = str(e) or type(e).__name__
    if not isinstance(e, RaybatchError):
        message = f"{type(e).__name__}: {message}"
    return Response(error_body(message), status_code=status, media_type="application/json",
                    headers=headers)


async def _raise(e: BaseException) -> Any:
    raise e


def _sequence(req: Any) -> tuple[Any, bool, bool] | None:
    """An infer request's sequence controls, when it names a sequence."""
    if req.sequence_id is None:
        return None
    return req.sequence_id, req.sequence_start, req.sequence_end


async def _sse(first: dict, rest: Any, wrap: Any) -> Any:
    """The SSE body: the first event (already received), the others as they come; an
    error after the start becomes an {"error"} event (the 200 is already sent)."""
    yield sse_event(wrap(first))
    try:
        async for event in rest:
            yield sse_event(wrap(event))
    except Exception as e:
        if http_status(e) >= 500 and not isinstance(e, RaybatchError):
            log.exception("generation failed mid-stream")
        yield sse_event({"error": str(e) or type(e).__name__})


@serve.deployment(max_ongoing_requests=2048)
@serve.ingress(api)
class Ingress:
    async def __init__(self, config_json: str) -> None:  # type: ignore[misc]
        # Async, so Serve marks the app ready only once every model's replicas serve.
        self.config = RaybatchConfig.model_validate_json(config_json)
        ingress = self.config.ingress
        self.models = {m.name: _Model(m, ingress.default_timeout_s, ingress.num_replicas)
                       for m in self.config.models}
        await asyncio.gather(*(m.backend.start() for m in self.models.values()))

    # -- the handle API ---------------------------------------------------------------
    async def infer(self, model: str, inputs: dict[str, np.ndarray],
                    parameters: dict[str, Any] | None = None) -> dict[str, np.ndarray]:
        """`handle.infer.remote("mlp", {"INPUT0": x})` → `{"OUTPUT0": y}`."""
        return await self._model(model).route.infer(inputs, parameters)

    async def infer_bundle(self, model: str, bundle: list[dict[str, np.ndarray]],
                           parameters: dict[str, Any] | None = None) -> list[Any]:
        """Many requests in one handle call (what `RaybatchClient` sends); each entry
        comes back as its outputs or as the exception that ended it."""
        route = self._model(model).route
        params = parameters or {}
        futs = []
        for inputs in bundle:
            try:
                futs.append(route.run(route.input_array(inputs), params.get("priority"),
                                      params.get("timeout_s")))
            except RaybatchError as e:
                futs.append(_raise(e))
        return list(await asyncio.gather(*futs, return_exceptions=True))

    async def generate(self, model: str, text_input: str,
                       parameters: dict[str, Any] | None = None) -> dict[str, Any]:
        """`handle.generate.remote("tinylm", "Once", {"max_tokens": 32})` → {"text_output",
        "finish_reason", "num_tokens", "prompt_tokens", "final"}."""
        return await self._model(model).route.generate(text_input, parameters)

    async def generate_stream(self, model: str, text_input: str,
                              parameters: dict[str, Any] | None = None) -> Any:
        """`handle.options(stream=True).generate_stream.remote(...)`: the events, one per
        step ({"text_output", "index"}), then the final one. Cancelling the call cancels
        the generation."""
        async for event in self._model(model).route.generate_stream(text_input, parameters):
            yield event

    async def infer_entries(self, model: str, bundle: list[tuple]) -> list[tuple]:
        """A `RaybatchClient` bundle for a model whose engine runs in the ingress
        (`batcher.placement: ingress`): entries `(key, items, priority, timeout_s)`,
        answered `(key, value, error)` as a batching actor answers them."""
        return await self._model(model).backend.infer_entries(bundle)

    async def route_info(self, model: str) -> tuple[str, list[Any] | None, float | None]:
        """What `RaybatchClient` needs to send to `model`'s engine itself: the model's
        config (JSON), the batching actors' handles (None: the engine runs in the
        ingress, send bundles to `infer_entries`), the default deadline."""
        m = self._model(model)
        return (m.config.model_dump_json(), m.backend.client_actors(),
                self.config.ingress.default_timeout_s)

    async def status(self) -> dict[str, Any]:
        return {name: await self._stats(m) for name, m in self.models.items()}

    # -- HTTP: the Open Inference Protocol ----------------------------------------------
    @api.get("/v2")
    async def server_metadata(self) -> JSONResponse:
        return JSONResponse(server_metadata_json("raybatch", "0.1.0"))

    @api.get("/v2/health/live")
    async def live(self) -> Response:
        return Response(status_code=200)

    @api.get("/v2/health/ready")
    async def ready(self) -> Response:
        ok = all([await self._is_ready(m) for m in self.models.values()])
        return Response(status_code=200 if ok else 503)

    # Before /v2/models/{model}, which would take "stats" for a model name.
    @api.get("/v2/models/stats")
    async def all_model_stats(self) -> Response:
        async def stats() -> Response:
            out = []
            for m in self.models.values():
                out.append(model_counters_json(m.spec, await self._stats(m)))
            return JSONResponse({"model_stats": out})
        return await self._guard(stats)

    # Every model route also answers under /versions/{version}, as Triton's do.
    @api.get("/v2/models/{model}")
    @api.get("/v2/models/{model}/versions/{version}")
    async def model_metadata(self, model: str, version: str | None = None) -> Response:
        return await self._guard(lambda: JSONResponse(
            metadata_json(self._model(model, version).spec)))

    @api.get("/v2/models/{model}/config")
    @api.get("/v2/models/{model}/versions/{version}/config")
    async def model_config(self, model: str, version: str | None = None) -> Response:
        return await self._guard(lambda: JSONResponse(
            model_config_json(self._model(model, version).spec)))

    @api.get("/v2/models/{model}/ready")
    @api.get("/v2/models/{model}/versions/{version}/ready")
    async def model_ready(self, model: str, version: str | None = None) -> Response:
        async def check() -> Response:
            ok = await self._is_ready(self._model(model, version))
            return Response(status_code=200 if ok else 503)
        return await self._guard(check)

    @api.get("/v2/models/{model}/stats")
    @api.get("/v2/models/{model}/versions/{version}/stats")
    async def model_stats(self, model: str, version: str | None = None) -> Response:
        async def stats() -> Response:
            m = self._model(model, version)
            raw = await self._stats(m)
            return JSONResponse({"model_stats": [model_counters_json(m.spec, raw)]})
        return await self._guard(stats)

    @api.post("/v2/models/{model}/infer")
    @api.post("/v2/models/{model}/versions/{version}/infer")
    async def infer_http(self, model: str, request: Request,
                         version: str | None = None) -> Response:
        async def infer() -> Response:
            m = self._model(model, version)
            limit = self.config.ingress.max_body_bytes
            check_content_length(request.headers, limit)
            body = await request.body()
            req = parse_infer_request(body, request.headers, m.spec, limit)
            array = m.route.input_array(req.inputs)
            outputs = await m.route.run(array, req.priority, req.timeout_s, _sequence(req))
            body, headers = encode_infer_response(m.config.name, m.config.version, req.id,
                                                  outputs, req.outputs_requested,
                                                  req.binary_data_output)
            return Response(body, headers=headers)
        return await self._guard(infer)

    @api.post("/v2/models/{model}/generate")
    @api.post("/v2/models/{model}/versions/{version}/generate")
    async def generate_http(self, model: str, request: Request,
                            version: str | None = None) -> Response:
        async def generate() -> Response:
            m = self._model(model, version)
            request_id, text, params = parse_generate_body(await self._body(request))
            final = await m.route.generate(text, params)
            return JSONResponse(generate_response(m.config.name, m.config.version,
                                                  request_id, final))
        return await self._guard(generate)

    @api.post("/v2/models/{model}/generate_stream")
    @api.post("/v2/models/{model}/versions/{version}/generate_stream")
    async def generate_stream_http(self, model: str, request: Request,
                                   version: str | None = None) -> Response:
        async def stream() -> Response:
            m = self._model(model, version)
            request_id, text, params = parse_generate_body(await self._body(request))
            events = m.route.generate_stream(text, params)
            try:  # errors before the first event are a proper 4xx/5xx, not an SSE event
                first = await events.__anext__()
            except BaseException:
                await events.aclose()
                raise
            name, version_ = m.config.name, m.config.version
            return StreamingResponse(
                _sse(first, events, lambda e: generate_response(name, version_, request_id, e)),
                media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        return await self._guard(stream)

    # -- shared path ----------------------------------------------------------------------
    async def _body(self, request: Request) -> bytes:
        limit = self.config.ingress.max_body_bytes
        check_content_length(request.headers, limit)
        body = await request.body()
        check_content_length({"content-length": str(len(body))}, limit)
        return body

    def _model(self, name: str, version: str | None = None) -> _Model:
        m = self.models.get(name)
        if m is None:
            raise UnknownModel(f"unknown model {name!r}: this server has {sorted(self.models)}")
        if version not in (None, "", m.config.version):
            raise UnknownModel(f"model {name!r} has version {m.config.version!r}, not "
                               f"{version!r}: leave the version out or ask for that one")
        return m

    async def _stats(self, m: _Model) -> dict[str, Any]:
        return await m.backend.stats()

    async def _is_ready(self, m: _Model) -> bool:
        return await m.backend.is_ready()

    async def _guard(self, handler: Any) -> Response:
        try:
            result = handler()
            return await result if asyncio.iscoroutine(result) else result
        except Exception as e:
            return _error_response(e)

