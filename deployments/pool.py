"""The replica pool of one model: Ray actors, their clients, and scaling on queue depth.

The batching actor owns the replicas (they are created from it, so they die
with it: deleting the app leaves none behind). The pool keeps between
`min_replicas` and `max_replicas` alive: it adds one when queued items per
replica exceed `scale_up_queue_items`, removes one after `scale_down_idle_s`
with nothing queued, and replaces a replica that died. A replica that cannot
be placed stays pending: that pending actor is what makes the Ray autoscaler
(and KubeRay) add a node.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import math
import time
from typing import Any

import ray
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError, RayTaskError

from batching.loop import ReplicaDied
from cluster.config import ModelConfig
from deployments.hosts import Host
from deployments.replica import ModelReplica

log = logging.getLogger(__name__)
PENDING_WARN_S = 15.0


async def _await(ref: Any) -> Any:
    return await ref


class RayReplicaClient:
    """`ReplicaClient` over a `ModelReplica` actor: one Ray call per batch."""

    def __init__(self, actor: Any, index: int) -> None:
        self.actor = actor
        self.index = index
        self.name = f"replica-{index}"

    async def run(self, items: Any) -> tuple[Any, float]:
        return await self._call(self.actor.run, items)

    async def _call(self, method: Any, *args: Any) -> Any:
        try:
            return await method.remote(*args)
        except (ActorDiedError, ActorUnavailableError, RayActorError) as e:
            raise ReplicaDied(f"{self.name}: {type(e).__name__}") from e
        except RayTaskError as e:  # the model raised: hand its own exception on
            cause = e.cause if isinstance(e.cause, BaseException) else None
            raise (cause or e) from None


class SequenceReplicaClient(RayReplicaClient):
    """`SequenceReplicaClient` over a `SequenceReplica`: batches, and idle releases."""

    async def release(self, sequence_ids: list[Any]) -> None:
        await self._call(self.actor.release, sequence_ids)


class StepReplicaClient(RayReplicaClient):
    """`StepReplicaClient` over a `StepReplica`: one call per generation step."""

    async def step(self, join: list[Any], leave: list[Any]) -> tuple[list[Any], float]:
        return await self._call(self.actor.step, join, leave)


def _replica_classes(kind: str) -> tuple[type, type]:
    """The replica actor class and its client class for a model of `kind`."""
    if kind == "dynamic":
        return ModelReplica, RayReplicaClient
    from deployments.stateful_replica import SequenceReplica, StepReplica

    if kind == "sequence":
        return SequenceReplica, SequenceReplicaClient
    return StepReplica, StepReplicaClient


class ReplicaPool:
    def __init__(self, config: ModelConfig, host: Host) -> None:
        self.config = config
        self.host = host
        self._actor_class, self._client_class = _replica_classes(config.batching.kind)
        self._json = config.model_dump_json()
        self._indices = itertools.count()
        self._starting: dict[int, Any] = {}
        self._idle_since: float | None = None
        self._task: asyncio.Task | None = None
        self._tasks: set[asyncio.Task] = set()

    def _actor_options(self) -> dict[str, Any]:
        r = self.config.replicas
        threads = str(max(1, math.floor(r.num_cpus))) if r.num_cpus else "1"
        numa_resources, placement_env = self._placement()
        return {
            "num_cpus": r.num_cpus,
            "num_gpus": r.num_gpus,
            "resources": {**r.resources, **numa_resources},
            "max_restarts": 0,
            "runtime_env": {"env_vars": {"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads,
                                         **placement_env, **r.env}},
        }

    def _placement(self) -> tuple[dict[str, float], dict[str, str]]:
        """The next replica's numa<N> resource and env (NUMA node, GPU order): cluster.raynode."""
        from cluster.raynode import NumaChooser, numa_request, numa_view

        chooser = self.__dict__.setdefault("_numa_chooser", NumaChooser())
        return numa_request(self.config.replicas, chooser, numa_view, time.monotonic())

    async def start(self) -> None:
        """Start `min_replicas` (at least one) and wait until they serve; then keep scaling."""
        want = max(1, self.config.replicas.min_replicas)
        await asyncio.gather(*(self._add() for _ in range(want)))
        self._task = asyncio.get_running_loop().create_task(self._autoscale())

    async def _add(self) -> None:
        await self._serve(*self._create())

    def _create(self) -> tuple[int, Any]:
        index = next(self._indices)
        actor = ray.remote(concurrency_groups={"control": 1})(self._actor_class).options(
            **self._actor_options()).remote(self._json, index)
        self._starting[index] = actor
        return index, actor

    async def _serve(self, index: int, actor: Any) -> None:
        ready = asyncio.ensure_future(_await(actor.info.remote()))
        try:
            while True:
                done, _ = await asyncio.wait([ready], timeout=PENDING_WARN_S)
                if done:
                    ready.result()
                    break
                # Pending is normal while an autoscaler adds a node; silent pending is not.
                log.warning("%s replica-%d is not placed after %.0f s: it asks for %s; the "
                            "cluster has %s free. Lower replicas.num_cpus/num_gpus or add nodes.",
                            self.config.name, index, PENDING_WARN_S, self._demand(),
                            ray.available_resources())
        except Exception as e:
            log.error("replica-%d of %s failed to start: %s", index, self.config.name, e)
            raise
        finally:
            self._starting.pop(index, None)
        self.host.add_replica(self._client_class(actor, index))

    def _spawn(self, coro: Any) -> None:
        task = asyncio.get_running_loop().create_task(coro)
        self._tasks.add(task)  # referenced, so it is not collected mid-flight
        task.add_done_callback(self._tasks.discard)

    def _demand(self) -> dict[str, float]:
        r = self.config.replicas
        return {"CPU": r.num_cpus, **({"GPU": r.num_gpus} if r.num_gpus else {}), **r.resources}

    def replaced(self, client: RayReplicaClient) -> None:
        """A replica died: start another in its place (called by the host)."""
        log.warning("replacing %s of model %s", client.name, self.config.name)
        # Created now, not in the task: the new replica must count as starting before the
        # autoscaler next compares live replicas with min_replicas, or it starts one more.
        self._spawn(self._serve(*self._create()))

    async def _autoscale(self) -> None:
        r = self.config.replicas
        while True:
            await asyncio.sleep(0.5)
            live = len(self.host.replicas) + len(self._starting)
            queued = self.host.queued_work
            if live < r.min_replicas or (
                live < r.max_replicas and queued > r.scale_up_queue_items * max(live, 1)
            ):
                self._spawn(self._add())
                continue
            now = time.monotonic()
            busy = queued or self.host.busy
            self._idle_since = None if busy else (self._idle_since or now)
            if (self._idle_since is not None and now - self._idle_since > r.scale_down_idle_s
                    and len(self.host.replicas) > max(r.min_replicas, 1)):
                self._remove_one()
                self._idle_since = now

    def _remove_one(self) -> None:
        # The least busy; among equals the newest: it is the one an autoscaler added a
        # node for, so that node can go idle and be removed (the oldest stay where they were).
        victim = min(self.host.replicas, key=lambda c: (self.host.outstanding(c), -c.index))
        self.host.remove_replica(victim)
        assert isinstance(victim, RayReplicaClient)
        ray.kill(victim.actor, no_restart=True)
        log.info("scaled %s of %s down", victim.name, self.config.name)

    async def info(self) -> list[dict[str, Any]]:
        out = []
        for client in self.host.replicas:
            assert isinstance(client, RayReplicaClient)
            try:
                info = await client.actor.info.remote()
                info["state"] = "ALIVE"
            except Exception as e:
                info = {"index": client.index, "state": f"DEAD ({type(e).__name__})"}
            info["outstanding_batches"] = self.host.outstanding(client)
            out.append(info)
        out += [{"index": i, "state": "PENDING"} for i in self._starting]
        return out
