"""The batching actor: one per model (or per `batcher.group` of models), hosting the engine
in front of the replica pool.

An async Ray actor. Ingress replicas (and `RaybatchClient`s) send it bundles
of about one batch of requests in one plain Ray call; it submits each to its
host and answers with every request's outcome once the bundle has ended, so
64 requests cost one round trip instead of 64.
The engine, the ledger and the dispatch policy are the same objects the
embedded host uses; only the replicas are Ray actors here.

The model's `batching.kind` picks the host (`deployments.batcher.hosts`): dynamic
batching for stateless models, sequence batching for stateful ones (the
bundle entries then carry each request's sequence controls), and iterative
batching for generative ones, whose generations stream through the
multiplexed calls of `deployments.wire.generation` instead of bundles.

Metrics (`deployments.metrics`): the host records per batch into a
`BatcherMetrics`; a task samples the host's and the pool's gauges and counts
every `metrics.interval_s`; requests refused at submit are counted per bundle.

Several dynamic models may share one actor (`batcher.group`: fewer processes on a small
machine): each keeps an engine of its own (`ModelEngine`: host, pool, metrics, keys), and
each call names its model (the first model's by default).

Request ids are the actor's own integers, mapped back to the caller's keys,
so ingress replicas never collide. A caller that gives up sends the keys of
its requests to `cancel` (one call per tick, see `deployments.ingress.coalesce`): a
request still queued never runs, and its batch-mates are unaffected (the host
took their inputs when it formed the batch). For a block some of whose clients hung up it
sends the rows of theirs instead (`deployments.wire.withdraw.Withdraw`): those still
queued never run, and the block's answer says which rows it carries.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
from typing import Any

import ray

from batching.errors import Draining, InvalidRequest, RaybatchError
from batching.loop import detached_task
from batching.metrics import NULL_RECORDER, outcome_of
from cluster.config import MetricsConfig, ModelConfig
from deployments.batcher.attachments import Attachments
from deployments.batcher.hosts import (
    Host,
    make_host,
    model_kind,
)
from deployments.heap import freeze_startup_heap
from deployments.metrics import BatcherMetrics, every
from deployments.replica.pool import ReplicaPool
from deployments.wire.bundles import (
    Arrival,
    Entry,
    Outcome,
    Stacked,
    StackedOutcomes,
    Stamp,
    entries,
    entry_requests,
    outcome,
    pack_outcomes,
    submit_entry,
)
from deployments.wire.dialer import listen_host
from deployments.wire.generation import StreamHub
from deployments.wire.keepalive import Keepalive
from deployments.wire.link import LinkServer
from deployments.wire.withdraw import Withdraw

log = logging.getLogger(__name__)

# A bundle is `Entry`s in (or `Stacked`), an `Outcome` per entry out (or `StackedOutcomes`).


class ModelEngine:
    """One model's engine in a batching actor: its host over its replica pool, its
    metrics, the callers' keys of its open requests, its generations' hub."""

    def __init__(self, config: ModelConfig, shard: int, metrics_config: MetricsConfig) -> None:
        self.config = config
        self.kind = model_kind(config)
        self.shard = shard
        self.metrics_config = metrics_config
        self.metrics: BatcherMetrics | None = None
        self._ids = itertools.count()
        self._by_key: dict[tuple[str, Any], int] = {}  # (caller, key) -> open request id
        self.cancelled_by_caller = 0
        self._started: asyncio.Future | None = None
        self.host: Host | None = None
        self.pool: ReplicaPool | None = None
        self.hub: StreamHub | None = None

    def start_now(self) -> None:
        """Start the replicas now (on the actor's loop), not at the first call."""
        self._started = detached_task(self._start())
        # An error is raised to every caller of ensure_started; mark it seen here so an
        # actor nobody calls does not log "exception was never retrieved" besides.
        self._started.add_done_callback(lambda f: f.cancelled() or f.exception())

    async def ensure_started(self) -> None:
        if self._started is None:
            self._started = detached_task(self._start())
        await asyncio.shield(self._started)

    async def _start(self) -> None:
        if self.metrics_config.enabled:
            self.metrics = BatcherMetrics(self.config, self.shard)
        self.host = make_host(self.config, on_replica_died=lambda c: self.pool.replaced(c),
                              recorder=self.metrics or NULL_RECORDER)
        self.pool = ReplicaPool(self.config, self.host, record_metrics=self.metrics is not None)
        if self.kind == "iterative":
            self.hub = StreamHub(self.host, lambda: next(self._ids))
        if self.metrics is not None:
            metrics = self.metrics  # sampled on the metrics clock: gauges, counts, histograms
            self._publisher = asyncio.ensure_future(every(
                self.metrics_config.interval_s,
                lambda: metrics.publish(self.host.snapshot(), self.pool.snapshot())))
        await self.pool.start()
        log.info("batcher for %s (%s) ready with %d replicas", self.config.name, self.kind,
                 len(self.host.replicas))

    async def infer(self, bundle: list[Entry] | Stacked, caller: str | None,
                    sent: Stamp | None, draining: str | None
                    ) -> list[Outcome] | StackedOutcomes:
        await self.ensure_started()
        host = self.host
        assert host is not None
        opened: dict[asyncio.Future, tuple[Any, int]] = {}  # future -> (key, request id)
        out: list[Outcome] = []
        refused: list[BaseException] = []
        by_key = self._by_key
        if draining is not None:
            return [Outcome(entry.key, None, Draining(draining)) for entry in entries(bundle)]
        arrival = Arrival(sent)  # each deadline on this node's clock, once
        for entry in entries(bundle):
            rid = next(self._ids)
            try:
                entry = arrival.entry(entry)
                opened[submit_entry(host, self.kind, self.config.name, rid, entry)] = entry.key, rid
            except RaybatchError as e:  # QueueFull, InvalidRequest, UnknownSequence, ...
                out.append(Outcome(entry.key, None, e))
                refused.extend([e] * entry_requests(entry))  # a block: its count
                continue
            if caller is not None:
                by_key[caller, entry.key] = rid
        if refused and self.metrics is not None:
            self.metrics.refused(outcome_of(e) for e in refused)
        if opened:
            try:
                await asyncio.wait(opened)
            except asyncio.CancelledError:  # the call itself was cancelled: nobody waits
                for fut, (_, rid) in opened.items():
                    if not fut.done():
                        host.cancel(rid, "cancelled: its bundle's call was cancelled")
                raise
            finally:
                if caller is not None:
                    for key, _ in opened.values():
                        by_key.pop((caller, key), None)
        out += [outcome(key, f) for f, (key, _) in opened.items()]
        return pack_outcomes(bundle, out)

    def cancel(self, caller: str, keys: list[Any]) -> int:
        if self.host is None:
            return 0
        found = 0
        for key in keys:
            if type(key) is Withdraw:  # rows of a block, not the whole request
                self._withdraw(caller, key)
                continue
            rid = self._by_key.pop((caller, key), None)
            if rid is not None:
                found += 1
                self.host.cancel(rid, "cancelled: its caller gave up")
        self.cancelled_by_caller += found
        return found

    def _withdraw(self, caller: str, message: Withdraw) -> None:
        """Withdraw the rows of `caller`'s open request that the engine still holds queued
        (`deployments.wire.withdraw`); rows that are not the request's are logged, and
        change nothing."""
        try:
            rid = self._by_key.get((caller, message.key))
            cancel_rows = getattr(self.host, "cancel_rows", None)  # a dynamic host's
            if rid is not None and cancel_rows is not None:
                cancel_rows(rid, message.rows, "cancelled: its client went away")
        except (RaybatchError, TypeError) as e:  # TypeError: a key that is no dict key
            log.warning("a withdrawal of rows from %s was refused: %s", caller, e)

    async def drain(self, grace_s: float) -> dict[str, Any]:
        if self.host is None:
            return {"open_requests": 0, "failed": 0, "left_open": 0}
        before = self.host.stats()
        open_ = before["open_requests"]
        await self.host.close(grace_s, reason="the batching actor was stopped")
        after = self.host.stats()
        failed = after.get("fail", {}).get("count", 0) - before.get("fail", {}).get("count", 0)
        log.info("batcher for %s drained: %d open requests, %d failed", self.config.name,
                 open_, failed)
        return {"open_requests": open_, "failed": failed, "left_open": after["open_requests"]}

    async def stats(self) -> dict[str, Any]:
        await self.ensure_started()
        assert self.host is not None and self.pool is not None
        info = [{**r, "shard": self.shard} for r in await self.pool.info()]
        return {**self.host.stats(), "kind": self.kind, "replica_info": info,
                "batch_limit": self.config.batch_size,
                "cancelled_by_caller": self.cancelled_by_caller}


# Decorated here, not where the app is built: `serve build` writes this class's import
# path into the config, and Serve needs a Ray actor class there when it deploys the file.
@ray.remote
class BatcherActor:
    def __init__(self, model_json: str, shard: int = 0, metrics_json: str | None = None,
                 group_json: list[str] | None = None) -> None:
        """`group_json`: the other models of its `batcher.group`, each an engine of its own
        in this process (the first model's is the default of every call)."""
        metrics_config = MetricsConfig.model_validate_json(metrics_json or "{}")
        configs = [shard_config(ModelConfig.model_validate_json(j))
                   for j in [model_json, *(group_json or [])]]
        self.engines = {c.name: ModelEngine(c, shard, metrics_config) for c in configs}
        self.config = configs[0]
        self.kind = model_kind(self.config)
        self.shard = shard
        self.attachments = Attachments()  # the ingress replicas that use this actor
        self.draining: str | None = None  # why new requests are refused (deployments.ingress.drain)
        self.link: LinkServer | None = None  # callers' direct connections (deployments.wire.link)
        self._ready: asyncio.Future | None = None
        # Start the replicas now, not at the first call: Serve creates this actor before
        # the ingress replicas, so the model's replicas (and their setup, e.g. a model
        # that trains for seconds) overlap the ingress's own start. Ray runs an async
        # actor's constructor on its event loop; elsewhere (no loop) the first call starts.
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return
        for engine in self.engines.values():
            engine.start_now()

    def _engine(self, model: str | None) -> ModelEngine:
        if model is None:
            return self.engines[self.config.name]
        try:
            return self.engines[model]
        except KeyError:
            raise InvalidRequest(f"this batching actor runs {sorted(self.engines)}, not "
                                 f"{model!r}") from None

    @property
    def host(self) -> Host | None:
        """The first model's host (the only one, unless the actor runs a group)."""
        return self.engines[self.config.name].host

    async def _ensure_started(self) -> None:
        if self._ready is None:
            self._ready = detached_task(self._all_started())
        await asyncio.shield(self._ready)

    async def _all_started(self) -> None:
        await asyncio.gather(*(e.ensure_started() for e in self.engines.values()))
        freeze_startup_heap(f"batcher for {', '.join(self.engines)}")

    async def ready(self) -> bool:
        await self._ensure_started()
        return True

    async def infer(self, bundle: list[Entry] | Stacked, caller: str | None = None,
                    sent: Stamp | None = None, model: str | None = None
                    ) -> list[Outcome] | StackedOutcomes:
        """Run a bundle of requests; the outcome of each, once all have ended.

        Callers send bundles of about one batch, so waiting for all costs little,
        and one plain call is cheaper than a stream.
        `caller` names the sender's keys for `cancel`; None: they cannot be cancelled.
        `sent`: the sender's stamp (`deployments.wire.bundles.stamp`), by which each
        entry's deadline is read on this node's clock (`Arrival`). `model`: whose engine,
        in an actor that runs a group (None: its first model's).
        A `Stacked` bundle is answered stacked where it can be (`deployments.wire.bundles`).
        """
        return await self._engine(model).infer(bundle, caller, sent, self.draining)

    async def link_address(self, caller_node: str | None = None) -> tuple[str, int, bytes]:
        """Where a caller connects to send bundles and cancels without a Ray call each
        (`deployments.wire.link`): a Unix socket for a caller on this node, this node's
        address for one elsewhere (`deployments.wire.endpoint`); with the token it must send
        first."""
        if self.link is None:
            self.link = LinkServer(self.infer, self.cancel, Keepalive.of(self.config.replicas))
        return await self.link.address(listen_host(caller_node))

    async def cancel(self, caller: str, keys: list[Any], model: str | None = None) -> int:
        """Cancel `caller`'s requests `keys` (it gave up on them): what is still queued
        never runs; each ends with Cancelled. Keys already ended are ignored. A
        `deployments.wire.withdraw.Withdraw` in place of a key withdraws rows of a block
        instead (not counted). Returns how many were open."""
        return self._engine(model).cancel(caller, keys)

    # -- generative models: multiplexed streams (see deployments.wire.generation) -----------
    async def start_generations(self, caller: str, entries: list[tuple],
                                sent: Stamp | None = None) -> list[tuple]:
        """Start `(key, prompt, params[, deadline])` generations for `caller` (`sent`: its
        stamp, by which each deadline is read here); (key, error) of those refused at once
        (bad parameters, queue full, a deadline passed on the way)."""
        await self._ensure_started()
        engine = self._engine(None)
        if engine.hub is None or self.draining is not None:
            error = (Draining(self.draining) if self.draining is not None else
                     InvalidRequest(f"model {self.config.name!r} is not generative: use infer"))
            return [(key, error) for key, *_ in entries]
        refused = engine.hub.start(caller, entries, sent)
        if refused and engine.metrics is not None:
            engine.metrics.refused(outcome_of(e) for _, e in refused)
        return refused

    async def poll_generations(self, caller: str) -> list[tuple]:
        """Every new event of `caller`'s generations, waiting a while for the first."""
        await self._ensure_started()
        hub = self._engine(None).hub
        return await hub.poll(caller) if hub is not None else []

    async def cancel_generations(self, caller: str, keys: list) -> None:
        hub = self._engine(None).hub
        if hub is not None:
            hub.cancel(caller, keys)

    # -- draining on delete and redeploy (see deployments.ingress.drain) ---------------------------
    async def attach(self, replica_id: str, replica: Any) -> None:
        """An ingress replica uses this actor (called at its start and as a heartbeat)."""
        self.attachments.attach(replica_id, replica)

    async def detach(self, replica_id: str, grace_s: float) -> dict[str, Any]:
        """An ingress replica is stopping. If no live one is left, this actor is about to
        be killed: refuse new requests with Draining and run what was accepted, for up to
        `grace_s`, before answering."""
        left = await self.attachments.detach(replica_id)
        if left or all(e.host is None for e in self.engines.values()):
            return {"drained": False, "replicas_left": left}
        return await self._drain(grace_s)

    async def _drain(self, grace_s: float) -> dict[str, Any]:
        names = ("model " if len(self.engines) == 1 else "models ") + ", ".join(
            repr(n) for n in self.engines)
        self.draining = (f"{names} is being redeployed or deleted: this "
                         "batching actor takes no new requests; nothing of this one ran, retry")
        done = await asyncio.gather(*(e.drain(grace_s) for e in self.engines.values()))
        return {"drained": True, **{k: sum(d[k] for d in done)
                                    for k in ("open_requests", "failed", "left_open")}}

    async def stats(self, model: str | None = None) -> dict[str, Any]:
        await self._ensure_started()
        return {**await self._engine(model).stats(),
                "attached_ingress_replicas": len(self.attachments),
                # callers sending on a direct connection (deployments.wire.link)
                "linked_callers": len(self.link.connections) if self.link else 0,
                "link_hosts": sorted(self.link.servers) if self.link else [],
                "draining": self.draining is not None}


def shard_config(config: ModelConfig) -> ModelConfig:
    """The config one shard runs: its share (rounded up) of the model's replicas, and the
    default queue bound for that share (`limits.queue_batches`) where the policy has none."""
    n = config.batcher.shards
    r = config.replicas
    share = r.model_copy(update={"min_replicas": -(-r.min_replicas // n),
                                 "max_replicas": -(-r.max_replicas // n)})
    return config.model_copy(update={"replicas": share}).bounded()


