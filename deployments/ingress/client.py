"""`RaybatchClient`: a Python caller's requests, straight to the batching actors.

A Serve handle call is a Ray call after Serve's own routing: costly in CPU, and one more
hop (`benchmarks.serve.client_roundtrip` times it); a caller
(another deployment, a Ray task, a notebook) with a thousand concurrent requests
would pay that a thousand times. The client asks the ingress once per model for
its route (the model's config and its batching actors' handles), then does in
the caller's process what the ingress does: validate, pick the least-loaded
shard (for a sequence, the shard that holds it), and coalesce every request of
one event-loop tick into one call; generations share one long poll per
batching actor. If a batching actor was recreated, the failed requests get `WorkerDied`
and the next call fetches the route again. A request refused with `Draining` (the app
is being redeployed: nothing of it ran) is sent again, on a freshly fetched route, for
up to `DRAIN_RETRY_S`; so is one whose bundle was on its way when Serve ended the drained
actor (`BatcherStopped`: a draining actor starts nothing new). A model whose engine runs
in the ingress (`batcher.placement: ingress`) has no batching actor to reach: the client still
validates and coalesces, and sends each bundle through the app's handle
(`Ingress.infer_entries`), one Serve call per bundle instead of one per request;
its generations are streaming handle calls (`Ingress.generate_stream`).

    client = RaybatchClient()                       # the app named "raybatch"
    out = await client.infer("mlp", {"INPUT0": x})  # {"OUTPUT0": y}
    out = await client.infer("accumulator", {"INPUT0": x},
                             {"sequence_id": 7, "sequence_start": True})
    async for event in client.generate_stream("tinylm", "Once", {"max_tokens": 20}): ...
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import numpy as np

from batching.errors import Draining, WorkerDied
from batching.loop import detached_task
from cluster.config import ModelConfig
from deployments.ingress.coalesce import BatcherStopped
from deployments.ingress.route import ModelRoute

DRAIN_RETRY_S = 10.0


class RaybatchClient:
    def __init__(self, handle: Any = None, app_name: str = "raybatch") -> None:
        if handle is None:
            from ray import serve

            handle = serve.get_app_handle(app_name)
        self._handle = handle
        self._routes: dict[str, asyncio.Future] = {}

    @property
    def calls(self) -> int:
        """Ray calls sent to batching actors so far (one per bundle)."""
        return sum(c.bundles_sent for f in self._routes.values() if f.done()
                   and not f.exception() for c in f.result().shards)

    async def infer(self, model: str, inputs: dict[str, np.ndarray],
                    parameters: dict[str, Any] | None = None) -> dict[str, np.ndarray]:
        """Outputs of one request; raises the error that ended it (QueueFull, ...)."""
        pause_s, waited_s = 0.02, 0.0
        while True:
            route = await self._route(model)
            try:
                return await route.infer(inputs, parameters)
            except BatcherStopped:  # ended after its drain: what it had not answered
                self._forget(model, route)  # had not run; the new deployment takes it
                if waited_s >= DRAIN_RETRY_S or route.kind == "sequence":
                    raise  # a sequence's state went with it: the caller decides
            except WorkerDied:
                self._forget(model, route)  # maybe a recreated actor: ask again next time
                raise
            except Draining:  # refused before anything ran: the new deployment takes it
                self._forget(model, route)
                if waited_s >= DRAIN_RETRY_S:
                    raise
            await asyncio.sleep(pause_s)
            waited_s += pause_s
            pause_s = min(pause_s * 2, 0.5)

    def _forget(self, model: str, route: ModelRoute) -> None:
        """Drop the cached route of `model` if it still is `route` (fetch it again)."""
        fut = self._routes.get(model)
        if (fut is not None and fut.done() and not fut.cancelled() and fut.exception() is None
                and fut.result() is route):
            del self._routes[model]

    async def generate(self, model: str, text_input: str,
                       parameters: dict[str, Any] | None = None) -> dict[str, Any]:
        """A whole generation of a generative model: {"text_output", "finish_reason", ...}."""
        route = await self._route(model)
        return await route.generate(text_input, parameters)

    async def generate_stream(self, model: str, text_input: str,
                              parameters: dict[str, Any] | None = None
                              ) -> AsyncIterator[dict[str, Any]]:
        """A generation's events as they come (one per step, then the final one);
        closing the iterator early cancels the generation."""
        route = await self._route(model)
        async for event in route.generate_stream(text_input, parameters):
            yield event

    async def _route(self, model: str) -> ModelRoute:
        fut = self._routes.get(model)
        if fut is None:  # one lookup per model, however many callers wait for it
            fut = self._routes[model] = detached_task(self._fetch(model))
        try:
            return await asyncio.shield(fut)
        except Exception:
            self._routes.pop(model, None)
            raise

    async def _fetch(self, model: str) -> ModelRoute:
        config_json, actors, default_timeout_s = await self._handle.route_info.remote(model)
        config = ModelConfig.model_validate_json(config_json)
        if actors is None:  # the engine runs in the ingress replicas
            via = _ViaIngress(self._handle, model)
            streams = [_StreamsViaIngress(self._handle, model)]
            return ModelRoute(config, [lambda: via], default_timeout_s,
                              generators=streams if config.batching.kind == "iterative"
                              else None)
        return ModelRoute(config, [_const(a) for a in actors], default_timeout_s)


def _const(actor: Any) -> Any:
    return lambda: actor


class _ViaIngress:
    """Stands in for a batching actor (`infer.remote(bundle)`) when the engine runs in
    the ingress: a bundle goes to `Ingress.infer_entries` through the app's handle."""

    def __init__(self, handle: Any, model: str) -> None:
        self.infer = _Method(lambda bundle, caller=None, sent=None:
                             handle.infer_entries.remote(model, bundle, sent))
        # A caller's cancel is not sent on: the bundle's handle call carries its batch-mates
        # too. The request still ends at the engine; its answer is dropped here.
        self.cancel = _Method(lambda caller, keys: _nothing())


class _StreamsViaIngress:
    """Stands in for a `GenerateMux` when a generative model's engine runs in the ingress:
    each generation is one streaming handle call (`Ingress.generate_stream`); closing
    it early cancels that call, and with it the generation."""

    outstanding = 0  # the only one: nothing to balance

    def __init__(self, handle: Any, model: str) -> None:
        self._handle = handle
        self._model = model

    async def stream(self, prompt: str, params: dict[str, Any]) -> AsyncIterator[dict]:
        streaming = self._handle.options(stream=True)
        response = streaming.generate_stream.remote(self._model, prompt, params)
        final = False
        try:
            async for event in response:
                final = bool(event.get("final"))
                yield event
        finally:
            if not final:
                response.cancel()


async def _nothing() -> None:
    return None


class _Method:
    __slots__ = ("remote",)

    def __init__(self, remote: Any) -> None:
        self.remote = remote
