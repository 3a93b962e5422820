"""Where a model's engine runs, as an ingress replica sees it (`batcher.placement`).

`ActorBackend` (placement `actor`): the engine runs in one batching actor per
shard, a Serve deployment-scoped actor; the ingress coalesces each tick's
requests into one Ray call per batch's worth (`Coalescer`), and the actors
batch across every ingress replica.

`IngressBackend` (placement `ingress`): this ingress replica runs the engine
itself (`LocalEngine`: a `BatchHost` over its own `ReplicaPool`) and sends each
batch straight to a model replica: one Ray hop fewer per request, batches formed
per ingress replica (as `@serve.batch` does), every policy the same. Each ingress
replica owns its share of the model's replicas (rounded up), and they die with it.

Both give `ModelRoute` the same seam, `submit(items, priority, timeout_s, control)
-> future` and `outstanding`, so the route does not know where the engine runs.
A `RaybatchClient` of an ingress-placed model cannot reach the engine directly:
it sends its bundles through the app's handle (`Ingress.infer_entries`), one
Serve call per bundle, answered by whichever ingress replica Serve picks.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import Callable
from typing import Any

from batching.errors import InvalidRequest, RaybatchError, portable
from batching.types import Request
from cluster.config import ModelConfig
from deployments.route import ModelRoute
from deployments.stats import merge_stats

# (caller key, items, priority, timeout_s[, control]) -> (caller key, value, error)
Outcome = tuple[Any, Any, "BaseException | None"]


def batcher_actor_name(model: str, shard: int = 0) -> str:
    return f"batcher-{model}" if shard == 0 else f"batcher-{model}-{shard}"


def replica_share(config: ModelConfig, parts: int) -> ModelConfig:
    """`config` with its replica bounds divided (rounded up) over `parts` owners."""
    r = config.replicas
    share = r.model_copy(update={"min_replicas": -(-r.min_replicas // parts),
                                 "max_replicas": -(-r.max_replicas // parts)})
    return config.model_copy(update={"replicas": share})


class LocalEngine:
    """The engine in this process: a `BatchHost` over its own `ReplicaPool`, submitted to
    like a `Coalescer` (one future per request, no Ray call per request)."""

    def __init__(self, config: ModelConfig) -> None:
        self.config = config
        self._ids = itertools.count()
        self.host: Any = None
        self.pool: Any = None
        self._started: asyncio.Future | None = None

    async def start(self) -> None:
        """Start `min_replicas` replicas (once, however many callers ask) and wait for them."""
        if self._started is None:
            self._started = asyncio.ensure_future(self._start())
        await asyncio.shield(self._started)

    async def _start(self) -> None:
        from deployments.hosts import make_host
        from deployments.pool import ReplicaPool

        self.host = make_host(self.config, on_replica_died=lambda c: self.pool.replaced(c))
        self.pool = ReplicaPool(self.config, self.host)
        await self.pool.start()

    @property
    def ready(self) -> bool:
        s = self._started
        return s is not None and s.done() and not s.cancelled() and s.exception() is None

    @property
    def outstanding(self) -> int:
        return 0 if self.host is None else self.host.open_requests

    def submit(self, items: Any, priority: int | None, timeout_s: float | None,
               control: Any = None) -> asyncio.Future:
        """The future of one request's outcome; raises its error (QueueFull...) at once."""
        if control is not None:
            raise InvalidRequest(f"model {self.config.name!r} runs dynamic batching: "
                                 "sequence controls do not apply")
        return self.host.submit(Request(next(self._ids), items, False, priority, timeout_s,
                                        len(items)))

    async def infer(self, bundle: list[tuple]) -> list[Outcome]:
        """A bundle of `(key, items, priority, timeout_s[, control])`: every outcome, as a
        batching actor answers it (what `RaybatchClient` sends through the handle)."""
        await self.start()
        keys: dict[asyncio.Future, Any] = {}
        out: list[Outcome] = []
        for key, items, priority, timeout_s, *rest in bundle:
            try:
                keys[self.submit(items, priority, timeout_s, rest[0] if rest else None)] = key
            except RaybatchError as e:
                out.append((key, None, e))
        if keys:
            await asyncio.wait(keys)
        for fut, key in keys.items():
            error = fut.exception()
            if error is None:
                out.append((key, fut.result(), None))
            else:
                out.append((key, None, error if isinstance(error, RaybatchError)
                            else portable(error)))
        return out

    async def stats(self) -> dict[str, Any]:
        await self.start()
        return {**self.host.stats(), "kind": "dynamic", "placement": "ingress",
                "replica_info": await self.pool.info()}


class ActorBackend:
    """Placement `actor`: the model's batching actors (one per shard)."""

    placement = "actor"

    def __init__(self, config: ModelConfig, default_timeout_s: float | None,
                 get_actor: Callable[[str], Any]) -> None:
        self.names = [batcher_actor_name(config.name, i) for i in range(config.batcher.shards)]
        self._get = get_actor
        self.route = ModelRoute(config, [self._getter(n) for n in self.names],
                                default_timeout_s)
        self._ready: asyncio.Future | None = None

    def _getter(self, name: str) -> Callable[[], Any]:
        return lambda: self._get(name)

    def actors(self) -> list[Any]:
        return [self._get(name) for name in self.names]

    async def start(self, timeout_s: float = 300.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:  # the deployment-scoped actor may not be registered yet
            try:
                actors = self.actors()
                break
            except ValueError:
                if time.monotonic() > deadline:
                    raise
                await asyncio.sleep(0.2)
        await asyncio.gather(*(a.ready.remote() for a in actors))
        self._ready = asyncio.get_running_loop().create_future()
        self._ready.set_result(True)

    async def is_ready(self) -> bool:
        if self._ready is None:
            self._ready = asyncio.ensure_future(
                asyncio.gather(*(a.ready.remote() for a in self.actors())))
        if not self._ready.done():
            await asyncio.wait([self._ready], timeout=0.2)
        if self._ready.done() and self._ready.exception() is not None:
            self._ready = None
            return False
        return self._ready is not None and self._ready.done()

    async def stats(self) -> dict[str, Any]:
        return merge_stats(await asyncio.gather(*(a.stats.remote() for a in self.actors())))

    def client_actors(self) -> list[Any] | None:
        """What `RaybatchClient` sends to: the batching actors' handles."""
        return self.actors()

    async def infer_entries(self, bundle: list[tuple]) -> list[Outcome]:
        raise InvalidRequest(f"model {self.route.config.name!r} runs its engine in batching "
                             "actors: send bundles to them (RaybatchClient does)")


class IngressBackend:
    """Placement `ingress`: the engine runs here, in this ingress replica."""

    placement = "ingress"

    def __init__(self, config: ModelConfig, default_timeout_s: float | None,
                 ingress_replicas: int) -> None:
        self.engine = LocalEngine(replica_share(config, ingress_replicas))
        self.route = ModelRoute(config, [], default_timeout_s, shards=[self.engine])

    async def start(self) -> None:
        await self.engine.start()

    async def is_ready(self) -> bool:
        return self.engine.ready

    async def stats(self) -> dict[str, Any]:
        return await self.engine.stats()

    def client_actors(self) -> list[Any] | None:
        """None: the client sends its bundles through the app's handle."""
        return None

    async def infer_entries(self, bundle: list[tuple]) -> list[Outcome]:
        return await self.engine.infer(bundle)


Backend = ActorBackend | IngressBackend


def make_backend(config: ModelConfig, default_timeout_s: float | None, ingress_replicas: int,
                 get_actor: Callable[[str], Any]) -> Backend:
    if config.batcher.placement == "ingress":
        return IngressBackend(config, default_timeout_s, ingress_replicas)
    return ActorBackend(config, default_timeout_s, get_actor)
