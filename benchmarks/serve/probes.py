"""Probes: what Raybatch would reach with one hop less, and what each hop costs.

Not product paths: they exist to put numbers on the proposals in the
comparison's cost analysis, using the product's own pieces unchanged.

- `direct_client`: a caller's requests coalesced per loop tick (the product's
  `Coalescer`) and sent straight to the model's batching actor, skipping the
  Serve handle call and the ingress replica that `RaybatchClient` goes through.
- `HttpFront`: an aiohttp server in a Ray actor speaking the same OIP codec as the
  ingress (`parse_infer_request` / `encode_infer_response`) and feeding the same
  batching actor through a `Coalescer`: Raybatch's HTTP path without Serve's
  replica HTTP stack (uvicorn, ASGI wrapper, FastAPI).
- `plain_client`: like `direct_client`, but to a batching actor of its own
  (`PlainBatcher`: the product's `BatcherActor` with one method added) that
  answers each batch-sized chunk of a bundle with one plain Ray call instead of
  a stream: what the streaming protocol costs.
- `hop_latencies`: one request at a time through each layer, p50 and the
  caller's CPU, so a round trip can be split into its hops.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np

from benchmarks.serve.models import BenchModel


def _batcher_name(model: str) -> tuple[str, str]:
    """(name, namespace) of the batching actor of `model` (a deployment-scoped actor of the
    Raybatch ingress, registered under a longer name; the benchmark deploys one shard)."""
    import ray

    from deployments.ingress.placement import batcher_actor_name

    want = batcher_actor_name(model)
    for a in ray.util.list_named_actors(all_namespaces=True):
        if want in a["name"]:
            return a["name"], a["namespace"]
    raise LookupError(f"no batching actor named like {want!r}")


def batcher_actor(model: str) -> Any:
    import ray

    name, namespace = _batcher_name(model)
    return ray.get_actor(name, namespace=namespace)


def direct_client(model: str) -> Callable[[np.ndarray], Awaitable[Any]]:
    """`submit(x)`: coalesced per tick, one streaming call per bundle to the batching actor."""
    from deployments.ingress.coalesce import Coalescer

    actor = batcher_actor(model)
    coalescer = Coalescer(lambda: actor)

    async def submit(x: np.ndarray) -> Any:
        return await coalescer.submit(x, None, None)
    return submit


class PlainBatcher:
    """`BatcherActor` plus `infer_all`: a bundle's outcomes in one plain reply."""

    def __init__(self, model_json: str) -> None:
        from deployments.batcher.actor import BatcherActor

        # The product's class is a Ray actor class: build the plain class inside it here.
        self._inner = BatcherActor.__ray_actor_class__(model_json)

    async def ready(self) -> bool:
        return await self._inner.ready()

    async def stats(self) -> dict[str, Any]:
        return await self._inner.stats()

    async def infer_all(self, bundle: list) -> list:
        out: list = []
        async for chunk in self._inner.infer(bundle):
            out.extend(chunk)
        return out


async def plain_client(model: BenchModel) -> tuple[Any, Callable[[np.ndarray], Awaitable[Any]]]:
    """(actor, submit): requests of one loop tick, in plain calls of at most one batch each,
    to a `PlainBatcher` of its own (its replica asks for no logical CPU: the node's two are
    held already)."""
    import ray

    config = model.config.model_copy(
        update={"replicas": model.config.replicas.model_copy(update={"num_cpus": 0})})
    actor = ray.remote(PlainBatcher).options(num_cpus=0, max_concurrency=10_000).remote(
        config.model_dump_json())
    await actor.ready.remote()
    pending: list[tuple[int, Any, asyncio.Future]] = []
    keys = iter(range(1 << 62))

    async def send(group: list[tuple[int, Any, asyncio.Future]]) -> None:
        futures = {key: fut for key, _, fut in group}
        try:
            outcomes = await actor.infer_all.remote([(k, x, None, None) for k, x, _ in group])
        except Exception as e:
            outcomes = [(k, None, e) for k in futures]
        for key, value, error in outcomes:
            fut = futures[key]
            if error is None:
                fut.set_result(value)
            else:
                fut.set_exception(error)

    def flush() -> None:
        # One call per batch-sized chunk, so a bundle's first batch comes back while its
        # second runs, as the stream's chunks do.
        loop, size = asyncio.get_running_loop(), model.config.batching.max_batch_size
        group = pending[:]
        pending.clear()
        for i in range(0, len(group), size):
            loop.create_task(send(group[i : i + size]))

    async def submit(x: np.ndarray) -> Any:
        loop = asyncio.get_running_loop()
        fut = loop.create_future()
        pending.append((next(keys), x, fut))
        if len(pending) == 1:
            loop.call_soon(flush)
        return await fut

    return actor, submit


class HttpFront:
    """An aiohttp OIP endpoint `/v2/models/{model}/infer` in front of one batching actor."""

    def __init__(self, model_json: str, actor_name: str, namespace: str, port: int) -> None:
        from cluster.config import ModelConfig
        from deployments.ingress.deployment import model_spec

        self.config = ModelConfig.model_validate_json(model_json)
        self.spec = model_spec(self.config)
        self.port = port
        self._actor_ref = (actor_name, namespace)
        self._runner: Any = None

    async def start(self) -> int:
        import ray
        from aiohttp import web

        from deployments.ingress.coalesce import Coalescer

        actor = ray.get_actor(*self._actor_ref)
        self.coalescer = Coalescer(lambda: actor)
        app = web.Application()
        app.router.add_post(f"/v2/models/{self.config.name}/infer", self._infer)
        self._runner = web.AppRunner(app, access_log=None)
        await self._runner.setup()
        await web.TCPSite(self._runner, "127.0.0.1", self.port).start()
        return self.port

    async def _infer(self, request: Any) -> Any:
        from aiohttp import web

        from batching.errors import InvalidRequest
        from deployments.protocol import encode_infer_response, error_body, parse_infer_request

        try:
            req = parse_infer_request(await request.read(), request.headers, self.spec, 1 << 26)
        except InvalidRequest as e:
            return web.Response(body=error_body(str(e)), status=400)
        value = await self.coalescer.submit(req.inputs["INPUT0"], None, None)
        body, headers = encode_infer_response(
            self.config.name, self.config.version, req.id,
            {"OUTPUT0": np.asarray(value, dtype=np.float32)}, req.outputs_requested,
            req.binary_data_output)
        return web.Response(body=body, headers=headers)


async def start_http_front(model: BenchModel, port: int) -> tuple[Any, str]:
    """Start an `HttpFront` for `model`; returns (actor, url). It asks for no logical CPU,
    as the four other processes of the comparison already hold the node's two."""
    import ray

    name, namespace = _batcher_name(model.name)
    front = ray.remote(HttpFront).options(num_cpus=0, max_concurrency=10_000).remote(
        model.config.model_dump_json(), name, namespace, port)
    await front.start.remote()
    return front, f"http://127.0.0.1:{port}/v2/models/{model.name}/infer"


async def add_probes(model: BenchModel, port: int, handles: dict[str, Any],
                     submits: dict[str, Any], urls: dict[str, str],
                     fetch: dict[str, Any]) -> dict[str, Any]:
    """Add the probes' rows to a model's drivers: `probe.direct` and `probe.direct-plain`
    (handle path), `probe.aiohttp` (HTTP, on `port`). Returns the actors to kill after,
    and the serial hop latencies (not for minilm: a batch of 64 takes too long)."""
    submits["probe.direct"] = direct_client(model.name)
    plain, submits["probe.direct-plain"] = await plain_client(model)
    front, urls["probe.aiohttp"] = await start_http_front(model, port)
    fetch["probe.direct"] = fetch["probe.aiohttp"] = fetch["raybatch"]
    fetch["probe.direct-plain"] = plain.stats.remote
    extra: dict[str, Any] = {"actors": [front, plain]}
    if model.name != "minilm":
        extra["hops"] = await hop_latencies(model, handles)
    return extra


async def _serial(fn: Callable[[], Awaitable[Any]], n: int) -> dict[str, float]:
    for _ in range(5):
        await fn()
    lat = []
    cpu0 = time.process_time()
    for _ in range(n):
        t0 = time.perf_counter()
        await fn()
        lat.append(time.perf_counter() - t0)
    return {"p50_ms": float(np.percentile(lat, 50)) * 1e3,
            "caller_cpu_us": (time.process_time() - cpu0) / n * 1e6}


async def hop_latencies(model: BenchModel, handles: dict[str, Any],
                        n: int = 100) -> dict[str, dict[str, float]]:
    """Serial latencies through each layer: a full batch (64 items) and a single item."""
    import ray

    batcher = batcher_actor(model.name)
    x1 = model.payloads(1)[0]
    x64 = np.concatenate(model.payloads(64))
    bundle = [(i, x1, None, None) for i in range(64)]
    items = [{"INPUT0": x1}] * 64

    async def stream(b: list) -> None:  # now one plain call per bundle
        await batcher.infer.remote(b)

    @ray.remote(num_cpus=0)
    class Echo:
        async def echo(self, x: Any = None) -> Any:
            return x

        async def stream(self, x: Any = None) -> Any:
            yield x

    async def echo_stream(x: Any = None) -> None:
        async for ref in echo.stream.options(num_returns="streaming").remote(x):
            await ref

    echo = Echo.remote()
    raybatch = handles["raybatch"]
    steps: dict[str, Callable[[], Awaitable[Any]]] = {
        "ray actor call, empty": lambda: echo.echo.remote(),
        "ray actor call, 64 items": lambda: echo.echo.remote([x1] * 64),
        "ray actor call, 64 items as one array": lambda: echo.echo.remote(x64),
        "ray streaming actor call, 1 yield": lambda: echo_stream(),
        "serve handle call, trivial": lambda: handles["serve"].stats.remote(),
        "model alone, 64 (ceiling batch)": lambda: asyncio.sleep(0),
        "batcher stream, 64 (stream + replica hop + model)": lambda: stream(bundle),
        "raybatch infer_bundle, 64 (+ Serve hop)": lambda: raybatch.infer_bundle.remote(
            model.name, items),
        "batcher stream, 1 (+ delay)": lambda: stream(bundle[:1]),
        "raybatch handle infer, 1 (+ delay)": lambda: raybatch.infer.remote(
            model.name, {"INPUT0": x1}),
        "@serve.batch handle infer, 1 (+ delay)": lambda: handles["serve.batch"].infer.remote(x1),
    }
    out = {name: await _serial(fn, n) for name, fn in steps.items()}
    out["model alone, 64 (ceiling batch)"] = {"p50_ms": _model_ms(model, x64),
                                             "caller_cpu_us": 0.0}
    ray.kill(echo)
    return out


def _model_ms(model: BenchModel, x64: np.ndarray) -> float:
    from batching.model import instantiate, run_batch
    from cluster.config import import_object

    m = instantiate(import_object(model.config.transformer), (), dict(model.config.init_kwargs))
    m.setup("cpu")
    run_batch(m, x64)
    t0 = time.perf_counter()
    for _ in range(20):
        run_batch(m, x64)
    return (time.perf_counter() - t0) / 20 * 1e3
