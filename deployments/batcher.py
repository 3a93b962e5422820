"""The batching actor: one per model, hosting the engine in front of the replica pool.

An async Ray actor. Ingress replicas (and `RaybatchClient`s) send it bundles
of about one batch of requests in one plain Ray call; it submits each to its
`BatchHost` and answers with every request's outcome once the bundle has
ended, so 64 requests cost one round trip instead of 64.
The engine, the ledger and the dispatch policy are the same objects the
embedded host uses; only the replicas are Ray actors here.

Request ids are the actor's own integers, mapped back to the caller's keys
inside the stream, so ingress replicas never collide.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import Any

import ray

from batching.errors import RaybatchError
from batching.host import BatchHost
from batching.types import Request
from batching.worker import portable
from cluster.config import ModelConfig
from deployments.pool import ReplicaPool

log = logging.getLogger(__name__)

# (caller key, items with a leading batch dimension, priority, timeout_s)
BundleItem = tuple[Any, Any, "int | None", "float | None"]
# (caller key, value, error)
Outcome = tuple[Any, Any, "BaseException | None"]


# Decorated here, not where the app is built: `serve build` writes this class's import
# path into the config, and Serve needs a Ray actor class there when it deploys the file.
@ray.remote
class BatcherActor:
    def __init__(self, model_json: str, shard: int = 0) -> None:
        self.config = shard_config(ModelConfig.model_validate_json(model_json))
        self.shard = shard
        self._ids = itertools.count()
        self._started: asyncio.Future | None = None
        self.host: BatchHost | None = None
        self.pool: ReplicaPool | None = None

    async def _ensure_started(self) -> None:
        if self._started is None:
            self._started = asyncio.ensure_future(self._start())
        await asyncio.shield(self._started)

    async def _start(self) -> None:
        self.host = BatchHost(self.config.batching,
                              max_inflight=self.config.replicas.max_inflight_batches,
                              on_replica_died=lambda client: self.pool.replaced(client))
        self.pool = ReplicaPool(self.config, self.host)
        await self.pool.start()
        log.info("batcher for %s ready with %d replicas", self.config.name,
                 len(self.host.replicas))

    async def ready(self) -> bool:
        await self._ensure_started()
        return True

    async def infer(self, bundle: list[BundleItem]) -> list[Outcome]:
        """Run a bundle of requests; the outcome of each, once all have ended.

        Callers send bundles of about one batch, so waiting for all costs little,
        and one plain call is cheaper than a stream (1.2-1.4 ms against 2.4 ms here).
        """
        await self._ensure_started()
        assert self.host is not None
        keys: dict[asyncio.Future, Any] = {}
        out: list[Outcome] = []
        for key, items, priority, timeout_s in bundle:
            request = Request(next(self._ids), items, False, priority, timeout_s, len(items))
            try:
                keys[self.host.submit(request)] = key
            except RaybatchError as e:  # QueueFull, InvalidRequest, ServiceClosed
                out.append((key, None, e))
        if keys:
            await asyncio.wait(keys)
        out += [_outcome(keys[f], f) for f in keys]
        return out

    async def stats(self) -> dict[str, Any]:
        await self._ensure_started()
        assert self.host is not None and self.pool is not None
        info = [{**r, "shard": self.shard} for r in await self.pool.info()]
        return {**self.host.stats(), "replica_info": info}


def shard_config(config: ModelConfig) -> ModelConfig:
    """The config one shard runs: its share (rounded up) of the model's replicas."""
    n = config.batcher.shards
    r = config.replicas
    share = r.model_copy(update={"min_replicas": -(-r.min_replicas // n),
                                 "max_replicas": -(-r.max_replicas // n)})
    return config.model_copy(update={"replicas": share})


def _outcome(key: Any, fut: asyncio.Future) -> Outcome:
    error = fut.exception()
    if error is None:
        return key, fut.result(), None
    return key, None, error if isinstance(error, RaybatchError) else portable(error)
