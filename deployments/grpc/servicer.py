"""`GrpcServicer`: the GRPCInferenceService's calls over the ingress's models.

One coroutine per RPC, each a few lines over the same `ModelRoute` the HTTP and
handle paths use: decode (`codec`), run, encode. Errors never escape as
exceptions: a call that fails sets its gRPC status code and details on the
context (`status.grpc_status`) and returns an empty response, which Serve's
proxy passes on as the call's status (an exception would reach the client as
INTERNAL with a traceback). `ModelStreamInfer` is the one stream: each of its
requests runs as ModelInfer does, or as a generation, and a failed one gets an
`error_message` response on the stream instead (as Triton answers).

`GrpcIngress` is what Serve's gRPC proxy needs of the ingress deployment: a
method named after each RPC, taking the request proto (for the stream, an async
iterator of them) and `grpc_context`. The ingress sets `grpc_servicer` and
inherits these.
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable, Sequence
from contextlib import aclosing
from typing import Any, Protocol

from batching.errors import RaybatchError
from cluster.config import ModelConfig
from deployments.grpc import messages
from deployments.grpc.codec import check_outputs, read_infer_request, write_infer_response
from deployments.grpc.generate import (
    StepWriter,
    error_response,
    final_response,
    read_generate_request,
)
from deployments.grpc.status import grpc_status
from deployments.grpc.stream import serve_stream
from deployments.grpc.stubs import service_pb2 as pb
from deployments.protocol.metadata import (
    DEFAULT_EXTENSIONS,
    package_version,
    repository_index_json,
)

log = logging.getLogger(__name__)

class ServedModel(Protocol):
    """What the servicer needs of one model of the ingress."""

    config: ModelConfig
    route: Any  # deployments.ingress.route.ModelRoute


class GrpcServicer:
    def __init__(self, get_model: Callable[[str, str | None], ServedModel],
                 models: Callable[[], Iterable[ServedModel]],
                 is_ready: Callable[[ServedModel], Awaitable[bool]],
                 stats: Callable[[ServedModel], Awaitable[dict[str, Any]]],
                 max_bytes: int, server_name: str = "raybatch",
                 extensions: Sequence[str] = DEFAULT_EXTENSIONS) -> None:
        self._get = get_model
        self._models = models
        self._is_ready = is_ready
        self._stats = stats
        self._max_bytes = max_bytes
        self._server = (server_name, package_version(), tuple(extensions))

    async def ServerLive(self, request: Any, context: Any) -> pb.ServerLiveResponse:
        return pb.ServerLiveResponse(live=True)

    async def ServerReady(self, request: Any, context: Any) -> pb.ServerReadyResponse:
        async def ready() -> pb.ServerReadyResponse:
            states = [await self._is_ready(m) for m in self._models()]
            return pb.ServerReadyResponse(ready=all(states))
        return await _guard(context, pb.ServerReadyResponse, ready)

    async def ModelReady(self, request: Any, context: Any) -> pb.ModelReadyResponse:
        async def ready() -> pb.ModelReadyResponse:
            try:
                model = self._get(request.name, request.version or None)
            except RaybatchError:  # an unknown model is not ready (as Triton answers)
                return pb.ModelReadyResponse(ready=False)
            return pb.ModelReadyResponse(ready=await self._is_ready(model))
        return await _guard(context, pb.ModelReadyResponse, ready)

    async def ServerMetadata(self, request: Any, context: Any) -> pb.ServerMetadataResponse:
        return messages.server_metadata(*self._server)

    async def ModelMetadata(self, request: Any, context: Any) -> pb.ModelMetadataResponse:
        async def metadata() -> pb.ModelMetadataResponse:
            return messages.model_metadata(self._get(request.name, request.version or None)
                                           .config)
        return await _guard(context, pb.ModelMetadataResponse, metadata)

    async def ModelConfig(self, request: Any, context: Any) -> pb.ModelConfigResponse:
        async def config() -> pb.ModelConfigResponse:
            return messages.model_config(self._get(request.name, request.version or None)
                                         .config)
        return await _guard(context, pb.ModelConfigResponse, config)

    async def ModelStatistics(self, request: Any, context: Any) -> pb.ModelStatisticsResponse:
        async def statistics() -> pb.ModelStatisticsResponse:
            models = ([self._get(request.name, request.version or None)] if request.name
                      else list(self._models()))
            return pb.ModelStatisticsResponse(model_stats=[
                messages.model_statistics(m.config, await self._stats(m)) for m in models])
        return await _guard(context, pb.ModelStatisticsResponse, statistics)

    async def RepositoryIndex(self, request: Any, context: Any) -> pb.RepositoryIndexResponse:
        async def index() -> pb.RepositoryIndexResponse:
            models = list(self._models())
            ready = [await self._is_ready(m) for m in models]
            index = repository_index_json(
                ((m.config.name, m.config.version, ok) for m, ok in zip(models, ready)),
                request.ready)
            return pb.RepositoryIndexResponse(
                models=[pb.RepositoryIndexResponse.ModelIndex(**entry) for entry in index])
        return await _guard(context, pb.RepositoryIndexResponse, index)

    async def ModelInfer(self, request: Any, context: Any) -> pb.ModelInferResponse:
        async def infer() -> pb.ModelInferResponse:
            return await self._infer(self._get(request.model_name,
                                               request.model_version or None), request)
        return await _guard(context, pb.ModelInferResponse, infer)

    def ModelStreamInfer(self, requests: AsyncIterator[Any], context: Any
                         ) -> AsyncIterator[pb.ModelStreamInferResponse]:
        """Triton's decoupled stream (`deployments.grpc.stream`): a generative model's
        request streams its steps (`deployments.grpc.generate`), any other model's gets
        ModelInfer's response; a failed request gets an `error_message` response and the
        stream goes on."""
        return serve_stream(requests, self._stream_one, _stream_error)

    async def _infer(self, model: ServedModel, request: Any) -> pb.ModelInferResponse:
        config, route = model.config, model.route
        inputs = {t.name: t for t in config.inputs}
        outputs = {t.name: t for t in config.outputs}
        req = read_infer_request(request, inputs, config.name, self._max_bytes)
        check_outputs(req.outputs_requested, outputs, config.name)
        sequence = (None if req.sequence_id is None
                    else (req.sequence_id, req.sequence_start, req.sequence_end))
        result = await route.run(route.input_array(req.inputs), req.priority,
                                 req.timeout_s, sequence)
        return write_infer_response(pb.ModelInferResponse(), config.name, config.version,
                                    req.id, result, req.outputs_requested)

    async def _stream_one(self, request: Any, emit: Callable[[Any], None]) -> None:
        model = self._get(request.model_name, request.model_version or None)
        if model.config.batching.kind != "iterative":
            emit(final_response(await self._infer(model, request)))
            return
        config = model.config
        call = read_generate_request(request, {t.name: t for t in config.outputs},
                                     config.name, self._max_bytes)
        writer = StepWriter(config.name, config.version, call, emit)
        # Closed however this ends (a hang-up cancels this task): the stream's close
        # cancels the generation at the engine, at its next step.
        async with aclosing(model.route.generate_stream(call.prompt, call.parameters)
                            ) as events:
            try:
                async for event in events:
                    writer.event(event)
            except Exception:
                writer.flush()  # the text it generated, then the error's response
                raise


def _stream_error(request: Any, error: Exception) -> pb.ModelStreamInferResponse:
    if not isinstance(error, RaybatchError):
        log.exception("a ModelStreamInfer request failed", exc_info=error)
    return error_response(request, grpc_status(error)[1])


async def _guard(context: Any, empty: type, call: Callable[[], Awaitable[Any]]) -> Any:
    """`call()`'s response, or `empty()` with the error's status code set on `context`."""
    try:
        return await call()
    except Exception as e:
        code, details = grpc_status(e)
        if not isinstance(e, RaybatchError):
            log.exception("gRPC call failed")
        context.set_code(code)
        context.set_details(details)
        return empty()


class GrpcIngress:
    """The RPCs as Serve's gRPC proxy calls them on the ingress (method name = RPC name;
    Serve hands `grpc_context` to a method that has a parameter of that name)."""

    grpc_servicer: GrpcServicer

    async def ServerLive(self, request: Any, grpc_context: Any) -> Any:
        return await self.grpc_servicer.ServerLive(request, grpc_context)

    async def ServerReady(self, request: Any, grpc_context: Any) -> Any:
        return await self.grpc_servicer.ServerReady(request, grpc_context)

    async def ModelReady(self, request: Any, grpc_context: Any) -> Any:
        return await self.grpc_servicer.ModelReady(request, grpc_context)

    async def ServerMetadata(self, request: Any, grpc_context: Any) -> Any:
        return await self.grpc_servicer.ServerMetadata(request, grpc_context)

    async def ModelMetadata(self, request: Any, grpc_context: Any) -> Any:
        return await self.grpc_servicer.ModelMetadata(request, grpc_context)

    async def ModelConfig(self, request: Any, grpc_context: Any) -> Any:
        return await self.grpc_servicer.ModelConfig(request, grpc_context)

    async def ModelStatistics(self, request: Any, grpc_context: Any) -> Any:
        return await self.grpc_servicer.ModelStatistics(request, grpc_context)

    async def RepositoryIndex(self, request: Any, grpc_context: Any) -> Any:
        return await self.grpc_servicer.RepositoryIndex(request, grpc_context)

    async def ModelInfer(self, request: Any, grpc_context: Any) -> Any:
        return await self.grpc_servicer.ModelInfer(request, grpc_context)

    async def ModelStreamInfer(self, request_stream: Any, grpc_context: Any
                               ) -> AsyncIterator[Any]:
        # Serve streams what an async generator method yields, and closes it when the
        # client hangs up: closing the servicer's stream here at once (not whenever the
        # garbage collector gets to it) is what cancels its generations then.
        async with aclosing(self.grpc_servicer.ModelStreamInfer(request_stream,
                                                                grpc_context)) as responses:
            async for response in responses:
                yield response
