"""Where a model's engine runs, as an ingress replica sees it (`batcher.placement`).

`ActorPlacement` (placement `actor`): the engine runs in one batching actor per
shard, a Serve deployment-scoped actor; the ingress coalesces each tick's
requests into one Ray call per batch's worth (`Coalescer`), and the actors
batch across every ingress replica.

`IngressPlacement` (placement `ingress`): this ingress replica runs the engine
itself (`LocalEngine`: the model's host over its own `ReplicaPool`) and sends each
batch straight to a model replica: one Ray hop fewer per request, batches formed
per ingress replica (as `@serve.batch` does), every policy the same, and no
batching actor process to start. Each ingress replica owns its share of the
model's replicas (rounded up), and they die with it. Every kind runs here: a
generative model's streams come straight from its `IterativeHost` (no long poll:
the only Ray call per step is the step itself); a stateful model's sequences live
in this replica's engine, which is why the config allows that only with one
ingress replica (`RaybatchConfig._sequences_in_one_ingress`).

Both give `ModelRoute` the same seam, `submit(items, priority, deadline, control)
-> future` and `outstanding`, so the route does not know where the engine runs.
A `RaybatchClient` of an ingress-placed model cannot reach the engine directly:
it sends its bundles through the app's handle (`Ingress.infer_entries`), one
Serve call per bundle, answered by whichever ingress replica Serve picks.
"""

from __future__ import annotations

import asyncio
import itertools
import time
from collections.abc import AsyncIterator, Callable
from typing import Any, Protocol

from batching.errors import InvalidRequest, RaybatchError
from batching.loop import detached_task
from batching.metrics import NULL_RECORDER, outcome_of
from cluster.config import MetricsConfig, ModelConfig
from deployments.batcher.hosts import (
    Host,
    make_host,
    model_kind,
)
from deployments.ingress.route import ModelRoute
from deployments.metrics import BatcherMetrics, CallerMetrics, every
from deployments.protocol.stats import merge_stats
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
from deployments.wire.generation import event_json, generate_request

# A bundle is `Entry`s in (or `Stacked`), an `Outcome` per entry out (or `StackedOutcomes`).


def batcher_actor_name(model: str, shard: int = 0, group: str | None = None) -> str:
    """The batching actor's name: of the model's shard, or of its `batcher.group`."""
    if group is not None:
        return f"batcher-group-{group}"
    return f"batcher-{model}" if shard == 0 else f"batcher-{model}-{shard}"


def replica_share(config: ModelConfig, parts: int) -> ModelConfig:
    """`config` with its replica bounds divided (rounded up) over `parts` owners, and its
    queues bounded by default (`ModelConfig.bounded`) for that share."""
    r = config.replicas
    share = r.model_copy(update={"min_replicas": -(-r.min_replicas // parts),
                                 "max_replicas": -(-r.max_replicas // parts)})
    return config.model_copy(update={"replicas": share}).bounded()


def ingress_rank() -> int:
    """This Serve replica's rank in its deployment (0..num_replicas-1, unique among the
    running ones): what tells apart the model replicas of several ingress replicas in
    the metrics (each names its own `replica-0`...). 0 outside a Serve replica."""
    try:
        from ray import serve

        rank = serve.get_replica_context().rank
    except Exception:  # not in a Serve replica (a local test)
        return 0
    return int(getattr(rank, "rank", rank))


class PoolFactory(Protocol):
    """What starts and replaces the engine's model replicas (`deployments.replica.pool.ReplicaPool`;
    tests hand in one of in-process replicas)."""

    def __call__(self, config: ModelConfig, host: Host, record_metrics: bool = False) -> Any: ...


class LocalEngine:
    """The engine in this process: the model's host (`deployments.batcher.hosts.make_host`: dynamic,
    sequence or iterative) over its own `ReplicaPool`, submitted to like a `Coalescer` (one
    future per request, no Ray call per request) and, for a generative model, streamed
    from like a `GenerateMux` (`stream`: events straight from the host, no long poll)."""

    def __init__(self, config: ModelConfig, metrics: MetricsConfig | None = None,
                 replica_prefix: str = "", make_pool: PoolFactory | None = None) -> None:
        self.config = config
        self.kind = model_kind(config)
        self.metrics_config = metrics
        self.replica_prefix = replica_prefix  # of its replicas in the metrics' `replica` label
        self.metrics: BatcherMetrics | None = None
        self._publisher: asyncio.Future | None = None
        self._make_pool = make_pool
        self._ids = itertools.count()
        self._blocks: dict[asyncio.Future, int] = {}  # open blocks' futures -> their ids
        self.host: Any = None
        self.pool: Any = None
        self._started: asyncio.Future | None = None

    async def start(self) -> None:
        """Start `min_replicas` replicas (once, however many callers ask) and wait for them."""
        if self._started is None:
            self._started = detached_task(self._start())  # shared: no caller's context
        await asyncio.shield(self._started)

    async def _start(self) -> None:
        make_pool = self._make_pool
        if make_pool is None:
            from deployments.replica.pool import ReplicaPool as make_pool
        if self.metrics_config is not None and self.metrics_config.enabled:
            self.metrics = BatcherMetrics(self.config, replica_prefix=self.replica_prefix)
        self.host = make_host(self.config, on_replica_died=lambda c: self.pool.replaced(c),
                              recorder=self.metrics or NULL_RECORDER)
        self.pool = make_pool(self.config, self.host, record_metrics=self.metrics is not None)
        if self.metrics is not None:
            metrics = self.metrics  # sampled on the metrics clock, as a batching actor does
            self._publisher = asyncio.ensure_future(every(
                self.metrics_config.interval_s,
                lambda: metrics.publish(self.host.snapshot(), self.pool.snapshot())))
        await self.pool.start()

    @property
    def ready(self) -> bool:
        s = self._started
        return s is not None and s.done() and not s.cancelled() and s.exception() is None

    @property
    def outstanding(self) -> int:
        return 0 if self.host is None else self.host.open_requests

    def _refused(self, error: RaybatchError, requests: int = 1) -> None:
        """Count a request refused at submit, as a batching actor does."""
        if self.metrics is not None:
            self.metrics.refused((outcome_of(error),) * requests)

    def submit(self, items: Any, priority: int | None, deadline: float | None,
               control: Any = None, requests: int = 1) -> asyncio.Future:
        """The future of one request's outcome (`deadline`: time.monotonic() by which it
        ends, None: none; `control`: a sequence model's (sequence_id, start, end);
        `requests`: the clients' requests it stands for, as counted); raises its error
        (QueueFull, UnknownSequence, Overloaded...) at once."""
        return self._submit(Entry(None, items, priority, deadline, control, requests))

    def _submit(self, entry: Entry) -> asyncio.Future:
        """`entry` to the host under an id of this engine's (its key is not read)."""
        if entry.control is not None and self.kind == "dynamic":
            raise InvalidRequest(f"model {self.config.name!r} runs dynamic batching: "
                                 "sequence controls do not apply")
        rid = next(self._ids)
        try:
            fut = submit_entry(self.host, self.kind, self.config.name, rid, entry)
        except RaybatchError as e:
            self._refused(e, entry_requests(entry))
            raise
        if entry_requests(entry) > 1:  # a block: rows of its clients may be withdrawn
            self._blocks[fut] = rid
        fut.add_done_callback(lambda f: self._ended(f, rid))
        return fut

    def _ended(self, fut: asyncio.Future, rid: int) -> None:
        self._blocks.pop(fut, None)
        if fut.cancelled():  # its caller gave up: what is still queued never runs
            self.host.cancel(rid)

    def withdraw(self, fut: asyncio.Future, rows: Any) -> bool:
        """Withdraw the rows `rows` (indices into its items) of the block whose future is
        `fut`, those the engine still holds queued (`batching.dynamic.withdraw`); its
        answer then says which rows it carries (`batching.types.Rows`). False if `fut` is
        no open block of this engine."""
        rid = self._blocks.get(fut)
        if rid is None or fut.done():
            return False
        self.host.cancel_rows(rid, rows, "cancelled: its client went away")
        return True

    async def stream(self, prompt: Any, params: dict[str, Any]) -> AsyncIterator[dict]:
        """A generation's events as the protocol's JSON (`GenerateMux.stream`'s contract);
        raises its error. Closing it early (the client hung up) cancels the generation:
        its slot frees at the replica's next step."""
        await self.start()
        try:
            events = self.host.submit(generate_request(next(self._ids), prompt, params))
        except RaybatchError as e:
            self._refused(e)
            raise
        try:
            async for event in events:
                yield event_json(event)
        finally:
            await events.aclose()  # a no-op once it ended

    async def drain(self, timeout_s: float) -> None:
        """Run what this engine accepted (up to `timeout_s`; no waiting for fuller batches),
        then fail what is left with ServiceClosed; new requests are refused."""
        if self.host is not None:
            await self.host.close(timeout_s, reason="this ingress replica is stopping")
        if self._publisher is not None:
            self._publisher.cancel()

    async def infer(self, bundle: list[Entry] | Stacked, sent: Stamp | None = None
                    ) -> list[Outcome] | StackedOutcomes:
        """A bundle of `Entry`s (or `Stacked`): every
        outcome, as a batching actor answers it (what `RaybatchClient` sends through the
        handle); `sent`: its sender's stamp, by which each deadline is read on this
        node's clock (`deployments.wire.bundles.Arrival`)."""
        await self.start()
        keys: dict[asyncio.Future, Any] = {}
        out: list[Outcome] = []
        arrival = Arrival(sent)
        for entry in entries(bundle):
            try:
                keys[self._submit(arrival.entry(entry))] = entry.key
            except RaybatchError as e:
                out.append(Outcome(entry.key, None, e))
        if keys:
            await asyncio.wait(keys)
        return pack_outcomes(bundle, out + [outcome(key, fut)
                                            for fut, key in keys.items()])

    async def stats(self) -> dict[str, Any]:
        await self.start()
        return {**self.host.stats(), "kind": self.kind, "placement": "ingress",
                "batch_limit": self.config.batch_size, "replica_info": await self.pool.info()}


class ActorPlacement:
    """Placement `actor`: the model's batching actors (one per shard)."""

    placement = "actor"

    def __init__(self, config: ModelConfig, default_timeout_s: float | None,
                 get_actor: Callable[[str], Any], metrics: CallerMetrics | None = None) -> None:
        self.names = [batcher_actor_name(config.name, i, config.batcher.group)
                      for i in range(config.batcher.shards)]
        self.model = config.name
        self._get = get_actor
        self.route = ModelRoute(config, [self._getter(n) for n in self.names],
                                default_timeout_s, metrics)
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
            self._ready = detached_task(_all_ready(self.actors()))
        if not self._ready.done():
            await asyncio.wait([self._ready], timeout=0.2)
        if self._ready.done() and self._ready.exception() is not None:
            self._ready = None
            return False
        return self._ready is not None and self._ready.done()

    async def stats(self) -> dict[str, Any]:
        merged = merge_stats(await asyncio.gather(*(a.stats.remote(self.model)
                                                    for a in self.actors())))
        # `raybatch status` finds their nodes by these names (raybatch.nodes)
        return {**merged, "batching_actors": list(self.names)}

    def client_actors(self) -> list[Any] | None:
        """What `RaybatchClient` sends to: the batching actors' handles."""
        return self.actors()

    async def drain(self, timeout_s: float) -> None:
        """Nothing here: the batching actors drain themselves (`deployments.ingress.drain`)."""

    async def infer_entries(self, bundle: list[Entry], sent: Stamp | None = None
                            ) -> list[Outcome]:
        raise InvalidRequest(f"model {self.route.config.name!r} runs its engine in batching "
                             "actors: send bundles to them (RaybatchClient does)")


class IngressPlacement:
    """Placement `ingress`: the engine runs here, in this ingress replica."""

    placement = "ingress"

    def __init__(self, config: ModelConfig, default_timeout_s: float | None,
                 ingress_replicas: int, caller_metrics: CallerMetrics | None = None,
                 metrics: MetricsConfig | None = None,
                 make_pool: PoolFactory | None = None) -> None:
        prefix = f"ingress{ingress_rank()}-" if ingress_replicas > 1 else ""
        self.engine = LocalEngine(replica_share(config, ingress_replicas), metrics, prefix,
                                  make_pool)
        generative = config.batching.kind == "iterative"
        self.route = ModelRoute(config, [], default_timeout_s, caller_metrics,
                                shards=[self.engine],
                                generators=[self.engine] if generative else None)

    async def start(self) -> None:
        await self.engine.start()

    async def is_ready(self) -> bool:
        return self.engine.ready

    async def stats(self) -> dict[str, Any]:
        return await self.engine.stats()

    def client_actors(self) -> list[Any] | None:
        """None: the client sends its bundles through the app's handle."""
        return None

    async def drain(self, timeout_s: float) -> None:
        await self.engine.drain(timeout_s)

    async def infer_entries(self, bundle: list[Entry], sent: Stamp | None = None
                            ) -> list[Outcome]:
        return await self.engine.infer(bundle, sent)


Placement = ActorPlacement | IngressPlacement


def make_placement(config: ModelConfig, default_timeout_s: float | None, ingress_replicas: int,
                 get_actor: Callable[[str], Any], caller_metrics: CallerMetrics | None = None,
                 metrics: MetricsConfig | None = None) -> Placement:
    """`caller_metrics`: counts of what the route refuses itself; `metrics`: the config's
    metrics block, for an engine that runs here (it records what a batching actor would)."""
    if config.batcher.placement == "ingress":
        return IngressPlacement(config, default_timeout_s, ingress_replicas, caller_metrics,
                              metrics)
    return ActorPlacement(config, default_timeout_s, get_actor, caller_metrics)


async def _all_ready(actors: list[Any]) -> list[Any]:
    """Every batching actor's `ready` (the calls are made here, in the caller's task)."""
    return await asyncio.gather(*(a.ready.remote() for a in actors))
