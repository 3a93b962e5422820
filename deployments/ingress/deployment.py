"""The Serve ingress: the HTTP front door (`deployments.http`) and the handle API.

The ingress parses (a clear 4xx for anything wrong) and hands each request to the
model's `ModelRoute`, which checks it against the model's tensors, gives it its
deadline, and coalesces what arrived in the same loop tick into bundles of one
batch's worth for the least-loaded batching actor, which batches across all
ingress replicas; or, for a model with `batcher.placement: ingress`, submits it
to the engine running in this replica (`deployments.ingress.placement`).

HTTP is `deployments.http.OipApp`, a raw ASGI app, handed to Serve at replica start
(`__serve_build_asgi_app__`) and mounted on the direct-ingress fast path
(`deployments.http.oip.fastpath`) and, with `ingress.native_port`, served by Raybatch's own
HTTP server on that port (`deployments.http.pyserver.server`, no uvicorn); `ServeBackend` is
what it runs requests on. Errors map to
status codes in one place, `deployments.http.oip.errors.error_parts`. gRPC (the KServe v2 /
Triton GRPCInferenceService, through Serve's gRPC proxy) is `deployments.grpc`: the
ingress inherits the RPC methods Serve calls (`GrpcIngress`) and hands them the same
backend's models.
"""


import asyncio
import logging
from typing import Any

import numpy as np
from ray import serve

from batching.errors import RaybatchError
from cluster.config import MetricsConfig, ModelConfig, RaybatchConfig
from deployments.grpc import GrpcIngress, GrpcServicer
from deployments.grpc.reuseport import keep_serves_socket_options
from deployments.http import HttpLimits, ModelEntry, OipApp, UnknownModel, mount, unmount
from deployments.http.native.front import FrontServer
from deployments.http.native.front import available as front_available
from deployments.http.pyserver.server import HttpServer
from deployments.ingress.drain import IngressDrain
from deployments.ingress.placement import batcher_actor_name, make_placement
from deployments.metrics import CallerMetrics, HttpCounts, every
from deployments.protocol import InferRequest, ModelSpec, TensorSpec, served_extensions
from deployments.protocol.openai import ChatTemplate
from deployments.protocol.stats import model_counters_json
from deployments.protocol.wording import unknown_model, unknown_version
from deployments.wire.bundles import Entry, Outcome, StackedOutcomes, Stamp

__all__ = ["Ingress", "ServeBackend", "UnknownModel", "batcher_actor_name", "model_spec"]

log = logging.getLogger(__name__)

# Imported in a replica before Serve starts its direct-ingress gRPC server: that server's port
# then stays this replica's alone (deployments.grpc.reuseport).
keep_serves_socket_options()


def model_spec(m: ModelConfig) -> ModelSpec:
    return ModelSpec(
        m.name, m.version, "raybatch",
        inputs=[TensorSpec(t.name, t.datatype, t.shape) for t in m.inputs],
        outputs=[TensorSpec(t.name, t.datatype, t.shape) for t in m.outputs],
        max_batch_size=m.batch_size,
    )


def model_entry(m: ModelConfig) -> ModelEntry:
    """What the HTTP app knows of `m`."""
    t = m.chat_template
    return ModelEntry(m.name, m.version, model_spec(m), m.batching.kind == "iterative",
                      ChatTemplate(t.message, t.generation_prompt, t.stop))


def _this_actor() -> Any:
    import ray

    try:
        return ray.get_runtime_context().current_actor
    except Exception:  # not in an actor (a local test): batching actors cannot ping it
        return None


class _Model:
    """One model of this ingress replica: its endpoint entry, and where its engine runs
    (`batcher.placement`: batching actors, or this replica; `deployments.ingress.placement`)."""

    def __init__(self, config: ModelConfig, default_timeout_s: float | None,
                 ingress_replicas: int, metrics: MetricsConfig) -> None:
        self.config = config
        self.entry = model_entry(config)
        self.placement = make_placement(config, default_timeout_s, ingress_replicas,
                                        serve.get_deployment_actor,
                                        CallerMetrics(config) if metrics.enabled else None,
                                        metrics)
        self.route = self.placement.route

    def actors(self) -> list[Any]:
        """Its batching actors ([] when its engine runs in this replica)."""
        return self.placement.client_actors() or []


async def _raise(e: BaseException) -> Any:
    raise e


def _sequence(req: InferRequest) -> tuple[Any, bool, bool] | None:
    """An infer request's sequence controls, when it names a sequence."""
    if req.sequence_id is None:
        return None
    return req.sequence_id, req.sequence_start, req.sequence_end


class ServeBackend:
    """The models of one ingress replica: what `OipApp` runs requests on (`Backend`)."""

    def __init__(self, config: RaybatchConfig) -> None:
        ingress, metrics = config.ingress, config.metrics
        self.by_name = {m.name: _Model(m, ingress.default_timeout_s, ingress.num_replicas,
                                       metrics) for m in config.models}
        self._entries = [m.entry for m in self.by_name.values()]
        self.drain: IngressDrain | None = None  # set by the ingress: 503 once draining

    async def wait_ready(self) -> None:
        await asyncio.gather(*(m.placement.start() for m in self.by_name.values()))

    def get(self, name: str, version: str | None = None) -> _Model:
        if self.drain is not None:
            self.drain.check()  # every model call comes here: 503 once draining
        m = self.by_name.get(name)
        if m is None:
            raise UnknownModel(unknown_model(name, self.by_name))
        if version not in (None, "", m.config.version):
            raise UnknownModel(unknown_version(name, version, m.config.version))
        return m

    # -- deployments.http.Backend ----------------------------------------------------------
    def models(self) -> list[ModelEntry]:
        return self._entries

    def model(self, name: str, version: str | None = None) -> ModelEntry:
        return self.get(name, version).entry

    async def ready(self, model: ModelEntry) -> bool:
        return await self.by_name[model.name].placement.is_ready()

    async def raw_stats(self, name: str) -> dict[str, Any]:
        return await self.by_name[name].placement.stats()

    async def stats(self, model: ModelEntry) -> dict[str, Any]:
        return model_counters_json(model.spec, await self.raw_stats(model.name))

    async def infer(self, model: ModelEntry, request: InferRequest,
                    received_s: float | None = None) -> dict[str, np.ndarray]:
        route = self.by_name[model.name].route
        return await route.run(route.decoded_array(request.inputs, request.batch_size),
                               request.priority, request.timeout_s, _sequence(request),
                               received_s)

    def submit_infer(self, model: ModelEntry, request: InferRequest,
                     received_s: float | None = None,
                     requests: int = 1) -> tuple[asyncio.Future, Any]:
        route = self.by_name[model.name].route
        return route.submit(route.decoded_array(request.inputs, request.batch_size),
                            request.priority, request.timeout_s, _sequence(request),
                            received_s, requests), route.outputs

    def withdraw_infer(self, model: ModelEntry, future: asyncio.Future, rows: Any) -> bool:
        """Withdraw rows of a block `submit_infer` submitted, what of them is still queued
        (its clients hung up: `deployments.http.native.departures`)."""
        return self.by_name[model.name].route.withdraw(future, rows)

    def gather_s(self, model: ModelEntry) -> float:
        """How long the native front's requests of `model` may wait to fill a block while
        this replica has a full batch of it in flight (`deployments.http.native.gather`): the
        model's `max_queue_delay_s` where its engine is a batching actor (a block is one
        Ray call and one engine request there); 0 where the engine runs in this replica."""
        m = self.by_name[model.name]
        if m.placement.placement != "actor" or m.config.batching.kind != "dynamic":
            return 0.0
        return m.config.batching.max_queue_delay_s

    async def generate(self, model: ModelEntry, text: Any,
                       params: dict[str, Any]) -> dict[str, Any]:
        return await self.by_name[model.name].route.generate(text, params)

    def generate_stream(self, model: ModelEntry, text: Any, params: dict[str, Any]) -> Any:
        return self.by_name[model.name].route.generate_stream(text, params)


@serve.deployment(max_ongoing_requests=2048)
@serve.ingress()
class Ingress(GrpcIngress):
    async def __init__(self, config_json: str) -> None:  # type: ignore[misc]
        # Async, so Serve marks the app ready only once every model's replicas serve.
        self.http: OipApp | None = None
        self.http_metrics: HttpCounts | None = None
        self._http_export: asyncio.Future | None = None
        self.native: HttpServer | None = None
        self.drain: IngressDrain | None = None
        self.config = RaybatchConfig.model_validate_json(config_json)
        self.backend = backend = ServeBackend(self.config)
        # One list for both fronts (GET /v2 and gRPC ServerMetadata): what is served.
        self.extensions = served_extensions(m.batching.kind for m in self.config.models)
        self.grpc_servicer = GrpcServicer(
            backend.get, backend.by_name.values, lambda m: backend.ready(m.entry),
            lambda m: backend.raw_stats(m.config.name), self.config.ingress.max_body_bytes,
            self.config.ingress.server_name, self.extensions)
        backend.drain = self.drain = IngressDrain(
            lambda: [a for m in backend.by_name.values() for a in m.actors()],
            self.config.ingress.drain_timeout_s, _this_actor())
        await backend.wait_ready()
        await self.drain.attach()

    async def __serve_build_asgi_app__(self) -> OipApp:
        """Serve's HTTP app for this replica, built once the models are ready; also
        mounted on the direct-ingress fast path (`deployments.http.oip.fastpath`)."""
        ingress = self.config.ingress
        self.http = OipApp(self.backend, HttpLimits.from_config(ingress),
                           name=ingress.server_name, extensions=self.extensions)
        mount(self.http, ingress.route_prefix)
        if ingress.native_port is not None and self.native is None:
            # Raybatch's own HTTP server on this replica's loop (deployments.http.pyserver.server)
            if ingress.native_front and front_available():
                self.native = FrontServer.from_config(self.http, ingress,
                                                      owner=self.config.app_name)
            else:
                if ingress.native_front:
                    log.warning("ingress.native_front: the native front was not compiled "
                                "(no C compiler when Raybatch was installed); the Python "
                                "server serves alone. Install gcc and run `make setup`.")
                self.native = HttpServer.from_config(self.http.direct, ingress,
                                                     owner=self.config.app_name,
                                                     quick=self.http.quick)
            await self.native.start()
        metrics = self.config.metrics
        if metrics.enabled and self._http_export is None:  # raybatch_http_requests_total
            self.http_metrics = HttpCounts(self.http.counts)
            self._http_export = asyncio.ensure_future(
                every(metrics.interval_s, self.http_metrics.flush))
        return self.http

    async def __del__(self) -> None:
        """Serve's last hook before it kills the batching actors: refuse new requests
        (HTTP and handle), then drain the batching actors (`deployments.ingress.drain`)."""
        if self.http is not None:
            self.http.begin_drain()
            unmount(self.http)
        native = getattr(self, "native", None)
        if native is not None:  # no new connections here: the node's other replicas take them
            native.close()
        if getattr(self, "drain", None) is not None:  # None: __init__ failed before it
            await self.drain.finish()
            # Engines in this replica (placement ingress) finish what they accepted too.
            await asyncio.gather(*(m.placement.drain(self.config.ingress.drain_timeout_s)
                                   for m in self.backend.by_name.values()))
        if native is not None:  # what is still being answered ends, then the connections
            await native.stop(self.config.ingress.drain_timeout_s)
        if getattr(self, "_http_export", None) is not None:  # the last counts, then stop
            self._http_export.cancel()
            try:
                self.http_metrics.flush()
            except Exception:  # Ray going away first: those few counts are lost
                pass

    # -- the handle API ---------------------------------------------------------------
    async def infer(self, model: str, inputs: dict[str, np.ndarray],
                    parameters: dict[str, Any] | None = None) -> dict[str, np.ndarray]:
        """`handle.infer.remote("mlp", {"INPUT0": x})` → `{"OUTPUT0": y}`."""
        return await self.backend.get(model).route.infer(inputs, parameters)

    async def infer_bundle(self, model: str, bundle: list[dict[str, np.ndarray]],
                           parameters: dict[str, Any] | None = None) -> list[Any]:
        """Many requests in one handle call (what `RaybatchClient` sends); each entry
        comes back as its outputs or as the exception that ended it."""
        route = self.backend.get(model).route
        priority, timeout_s, _ = route.parameters(parameters)
        futs = []
        for inputs in bundle:
            try:
                futs.append(route.run(route.input_array(inputs), priority, timeout_s))
            except RaybatchError as e:
                futs.append(_raise(e))
        return list(await asyncio.gather(*futs, return_exceptions=True))

    async def generate(self, model: str, text_input: str,
                       parameters: dict[str, Any] | None = None) -> dict[str, Any]:
        """`handle.generate.remote("tinylm", "Once", {"max_tokens": 32})` → {"text_output",
        "finish_reason", "num_tokens", "prompt_tokens", "final"}."""
        return await self.backend.get(model).route.generate(text_input, parameters)

    async def generate_stream(self, model: str, text_input: str,
                              parameters: dict[str, Any] | None = None) -> Any:
        """`handle.options(stream=True).generate_stream.remote(...)`: the events, one per
        step ({"text_output", "index"}), then the final one. Cancelling the call cancels
        the generation."""
        async for event in self.backend.get(model).route.generate_stream(text_input,
                                                                          parameters):
            yield event

    async def infer_entries(self, model: str, bundle: list[Entry],
                            sent: Stamp | None = None) -> list[Outcome] | StackedOutcomes:
        """A `RaybatchClient` bundle for a model whose engine runs in the ingress
        (`batcher.placement: ingress`): `deployments.wire.bundles.Entry`s
        (or `deployments.wire.bundles.Stacked`), answered an `Outcome` per entry
        (or `StackedOutcomes`) as a batching actor answers them; `sent`: its sender's stamp
        (`deployments.wire.bundles.stamp`), by which each deadline is read here."""
        return await self.backend.get(model).placement.infer_entries(bundle, sent)

    async def route_info(self, model: str) -> tuple[str, list[Any] | None, float | None]:
        """What `RaybatchClient` needs to send to `model`'s engine itself: the model's
        config (JSON), the batching actors' handles (None: the engine runs in the
        ingress, send bundles to `infer_entries`), the default deadline."""
        m = self.backend.get(model)
        return (m.config.model_dump_json(), m.placement.client_actors(),
                self.config.ingress.default_timeout_s)

    async def status(self) -> dict[str, Any]:
        return {name: await self.backend.raw_stats(name) for name in self.backend.by_name}

    async def front_counts(self) -> dict[str, int]:
        """The native front's own counters on this replica (`fast`: requests it queued
        itself; `requests`, `streamed`: those it handed to Python whole or streamed;
        `refusals`; connections, slots...); {} where the native front does not run here."""
        stats = getattr(self.native, "stats", None)
        return stats() if callable(stats) else {}

    async def http_counts(self) -> dict[tuple[str, int], int]:
        """HTTP responses this replica sent, by (route template, status), on both the
        fast path and Serve's: what the metrics read."""
        return {} if self.http is None else self.http.response_counts()
