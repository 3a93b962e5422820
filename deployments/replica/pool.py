"""The replica pool of one model: its replicas, their clients, and scaling on queue depth.

The engine's process (a batching actor, or an ingress replica) owns the replicas:
actors created from it (so they die with it: deleting the app leaves none behind),
or, with `replicas.in_process`, threads of its own (`deployments.replica.inprocess`); the
pool treats both through the same client (`info`, `stop`, `placed`). The pool keeps between
`min_replicas` and `max_replicas` alive: it adds one when queued items per
replica exceed `scale_up_queue_items`, or when the engine refused requests because its
wait bound (`limits.max_queue_wait_s`) was reached and no replica is already starting
(admission by time keeps at most the bound's worth queued: for a model slower than
`scale_up_queue_items` a second, the queue never reaches the count), removes one after
`scale_down_idle_s`
with nothing queued, and replaces a replica that died. A replica that cannot
be placed stays pending: that pending actor is what makes the Ray autoscaler
(and KubeRay) add a node. `snapshot()` says how many replicas the scaling rule
wants, how many serve and how many are pending, for the metrics sampler.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import os
import time
from typing import Any

import ray

from batching.loop import LoopHost, detached_task
from cluster.config import ModelConfig
from cluster.demands import queued_for, waiting_demands
from cluster.modelpath import PYTHON_PATH_ENV
from deployments.metrics import PoolSnapshot
from deployments.replica.actor import ModelReplica, ReplicaSetupError, reads_ahead
from deployments.replica.client import RayReplicaClient, ReplicaClient
from deployments.replica.inprocess import InProcessClient
from deployments.wire.keepalive import Keepalive

log = logging.getLogger(__name__)
PENDING_WARN_S = 15.0
INFO_WAIT_S = 5.0  # a replica's info() for stats and `raybatch status`, at most


def _python_path() -> dict[str, str]:
    """The config's python_path, passed on to the replicas (see cluster.modelpath)."""
    value = os.environ.get(PYTHON_PATH_ENV)
    return {PYTHON_PATH_ENV: value} if value else {}


def _replica_class(kind: str) -> type:
    """The replica class (an actor's, or an in-process replica's) for a model of `kind`."""
    if kind == "dynamic":
        return ModelReplica
    from deployments.replica.stateful import SequenceReplica, StepReplica

    return SequenceReplica if kind == "sequence" else StepReplica


class ReplicaPool:
    def __init__(self, config: ModelConfig, host: LoopHost, record_metrics: bool = False) -> None:
        self.config = config
        self.host = host
        self.record_metrics = record_metrics
        self.desired = max(1, config.replicas.min_replicas)
        self._replica_class = _replica_class(config.batching.kind)
        self._json = config.model_dump_json()
        self._indices = itertools.count()
        self._starting: dict[int, Any] = {}
        self._idle_since: float | None = None
        self._refused_seen = 0  # the host's wait_refusals at the last look
        self._task: asyncio.Task | None = None
        self._tasks: set[asyncio.Task] = set()

    def _actor_options(self, index: int = -1) -> dict[str, Any]:
        r = self.config.replicas
        threads = str(max(1, math.floor(r.num_cpus))) if r.num_cpus else "1"
        numa_resources, placement_env = self._placement()
        resources = {**r.resources, **numa_resources}
        return {
            "num_cpus": r.num_cpus,
            "num_gpus": r.num_gpus,
            "resources": resources,
            **self._node(index, resources),
            "max_restarts": 0,
            "runtime_env": {"env_vars": {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads,
                                         **placement_env, **_python_path(), **r.env}},
        }

    def _threads(self) -> dict[str, int]:
        """With `replicas.read_ahead`, a dynamic model's replica reads its next batch while
        its device thread runs one: one Ray thread per pipeline slot
        (`deployments.replica.actor`). Otherwise, and for sequence and generation replicas
        (their calls change state in the order they are sent), Ray's one thread."""
        if not reads_ahead(self._replica_class, self.config):
            return {}
        return {"max_concurrency": self.config.replicas.max_inflight_batches}  # >= 2 here

    def _placement(self) -> tuple[dict[str, float], dict[str, str]]:
        """The next replica's numa<N> resource and env (NUMA node, GPU order): cluster.raynode."""
        from cluster.raynode import NumaChooser, numa_request, numa_view

        chooser = self.__dict__.setdefault("_numa_chooser", NumaChooser())
        return numa_request(self.config.replicas, chooser, numa_view, time.monotonic())

    def _node(self, index: int, resources: dict[str, float]) -> dict[str, Any]:
        """Where replica `index` may run (`replicas.labels`) and, with `replicas.spread`,
        the node it is sent to, softly: the one holding the fewest of this pool's replicas
        among those with room (`cluster.spread`, which says why not Ray's SPREAD)."""
        from cluster.spread import ReplicaSpread, actor_placement

        r = self.config.replicas
        out = actor_placement({}, r.labels)
        if not r.spread:
            return out
        spread = self.__dict__.setdefault("_spread", ReplicaSpread())
        live = [*(self.host.replicas if self.host is not None else ()), *self._starting.values()]
        demand = {"CPU": r.num_cpus, "GPU": r.num_gpus, **resources}
        return {**out, **spread.options(index, demand, [(c.index, getattr(c, "actor", None))
                                                        for c in live], r.labels)}

    async def start(self) -> None:
        """Start `min_replicas` (at least one) and wait until they serve; then keep scaling."""
        want = max(1, self.config.replicas.min_replicas)
        await asyncio.gather(*(self._add() for _ in range(want)))
        self._task = detached_task(self._autoscale())

    async def _add(self) -> None:
        await self._serve(*self._create())

    def _create(self) -> tuple[int, ReplicaClient]:
        index = next(self._indices)
        r = self.config.replicas
        if r.in_process:
            client: ReplicaClient = InProcessClient(self._replica_class, self._json, index,
                                                    self.record_metrics, r.batch_timeout_s)
        else:
            actor = ray.remote(concurrency_groups={"control": 1})(self._replica_class).options(
                **self._actor_options(index), **self._threads()).remote(
                self._json, index, self.record_metrics)
            # a dynamic model's replica takes its batches on a direct connection
            client = RayReplicaClient(actor, index, r.batch_timeout_s,
                                      link=r.link and self._replica_class.DEVICE_THREAD,
                                      keepalive=Keepalive.of(r))
        self._starting[index] = client
        return index, client

    async def _serve(self, index: int, client: ReplicaClient) -> None:
        ready = asyncio.ensure_future(client.info())
        try:
            while True:
                done, _ = await asyncio.wait([ready], timeout=PENDING_WARN_S)
                if done:
                    info = ready.result()
                    self._check_ready(index, client, info)
                    break
                await self._report_pending(index, client)
        except Exception as e:
            log.error("replica-%d of %s failed to start: %s", index, self.config.name, e)
            raise
        finally:
            self._starting.pop(index, None)
        seed = getattr(self.host, "seed_latency", None)  # dynamic models: warm-up timings
        if seed is not None:
            seed(info.get("warmup_batches", ()))
        self.host.add_replica(client)

    async def _report_pending(self, index: int, client: ReplicaClient) -> None:
        """Warn about a replica that waits for resources (normal while an autoscaler adds a
        node; silent pending is not). One whose process is starting (Ray took its resources
        and starts its worker: slow on a busy machine) or that is building its model is not
        a problem to warn about: that is logged at INFO. Only Ray's queue of waiting
        demands tells a queued actor from a starting one (`cluster.demands`)."""
        if await asyncio.to_thread(client.placed):  # GCS calls: not on the engine's loop
            log.info("%s replica-%d is placed and still starting after %.0f s",
                     self.config.name, index, PENDING_WARN_S)
            return
        waiting = await asyncio.to_thread(waiting_demands)
        if not queued_for(self._demand(), waiting):
            log.info("%s replica-%d has its resources and its process is still starting "
                     "after %.0f s", self.config.name, index, PENDING_WARN_S)
            return
        log.warning("%s replica-%d is not placed after %.0f s: it asks for %s; the cluster "
                    "has %s free. Lower replicas.num_cpus/num_gpus or add nodes.",
                    self.config.name, index, PENDING_WARN_S, self._demand(),
                    ray.available_resources())

    def _check_ready(self, index: int, client: ReplicaClient, info: dict[str, Any]) -> None:
        """Fail the start when the replica could not build its model; log time to ready."""
        if info.get("error"):
            client.stop()
            raise ReplicaSetupError(f"model {self.config.name!r}: replica-{index} cannot "
                                    f"serve: {info['error']}")
        log.info("%s replica-%d ready in %.2f s (setup %.2f s, warm-up %.2f s, batch sizes "
                 "%s)", self.config.name, index, info.get("ready_s", 0.0),
                 info.get("setup_s", 0.0), info.get("warmup_s", 0.0), info.get("batch_sizes"))

    def _spawn(self, coro: Any) -> None:
        task = detached_task(coro)
        self._tasks.add(task)  # referenced, so it is not collected mid-flight
        task.add_done_callback(self._tasks.discard)

    def _demand(self) -> dict[str, float]:
        r = self.config.replicas
        return {"CPU": r.num_cpus, **({"GPU": r.num_gpus} if r.num_gpus else {}), **r.resources}

    def replaced(self, client: ReplicaClient) -> None:
        """A replica died: start another in its place (called by the host). The old one is
        stopped: one taken for dead because its connection went silent (a partition) may
        still live, holding its resources and, once healed, sending late answers."""
        log.warning("replacing %s of model %s", client.name, self.config.name)
        try:
            client.stop()
        except Exception as e:  # dead already, or unreachable: Ray ends it with its node
            log.debug("stopping %s of %s: %r", client.name, self.config.name, e)
        # Created now, not in the task: the new replica must count as starting before the
        # autoscaler next compares live replicas with min_replicas, or it starts one more.
        self._spawn(self._serve(*self._create()))

    async def _autoscale(self) -> None:
        r = self.config.replicas
        while True:
            await asyncio.sleep(0.5)
            live = len(self.host.replicas) + len(self._starting)
            queued = self.host.queued_work
            seen, self._refused_seen = self._refused_seen, self.host.wait_refusals
            short = (queued > r.scale_up_queue_items * max(live, 1)
                     or (self._refused_seen > seen and not self._starting))
            self.desired = live
            if live < r.min_replicas or (live < r.max_replicas and short):
                self.desired = live + 1
                self._spawn(self._add())
                continue
            now = time.monotonic()
            busy = queued or self.host.busy
            self._idle_since = None if busy else (self._idle_since or now)
            if (self._idle_since is not None and now - self._idle_since > r.scale_down_idle_s
                    and len(self.host.replicas) > max(r.min_replicas, 1)):
                self.desired = len(self.host.replicas) - 1
                self._remove_one()
                self._idle_since = now

    def _remove_one(self) -> None:
        # The least busy; among equals the newest: it is the one an autoscaler added a
        # node for, so that node can go idle and be removed (the oldest stay where they were).
        victim = min(self.host.replicas, key=lambda c: (self.host.outstanding(c), -c.index))
        spread = self.__dict__.get("_spread")
        if spread is not None:  # let go, not lost: its node stays a first choice
            spread.removed(victim.index)
        self.host.remove_replica(victim)
        victim.stop()
        log.info("scaled %s of %s down", victim.name, self.config.name)

    def snapshot(self) -> PoolSnapshot:
        return PoolSnapshot(self.desired, len(self.host.replicas), len(self._starting),
                            self._demand())

    async def info(self) -> list[dict[str, Any]]:
        """Each replica's `info()`; one that does not answer within `INFO_WAIT_S` (its host
        cut off: a Ray call waits until Ray gives the node up) is said to be unreachable."""
        out = []
        for client in self.host.replicas:
            try:
                info = await asyncio.wait_for(client.info(), INFO_WAIT_S)
                info["state"] = "ALIVE"
            except asyncio.TimeoutError:
                info = {"index": client.index,
                        "state": f"UNREACHABLE (no answer in {INFO_WAIT_S:g} s)"}
            except Exception as e:
                info = {"index": client.index, "state": f"DEAD ({type(e).__name__})"}
            info["outstanding_batches"] = self.host.outstanding(client)
            out.append(info)
        out += [{"index": i, "state": "PENDING"} for i in self._starting]
        return out
