"""The client of one replica actor, as its engine's process (a batching actor, or an
ingress replica placing the engine itself) sees it: each batch a Ray call, or a frame on
the direct connection once one is open, bounded by the model's batch timeout.

Why a timer and not `asyncio.wait_for`: no extra task per batch; why a lost connection
marks the replica lost at once: a host cut off sends nothing, and its engine must stop
sending there before the pool replaces it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from typing import Any

import ray
from ray.exceptions import ActorDiedError, ActorUnavailableError, RayActorError, RayTaskError

from batching.errors import BatchTimedOut
from batching.loop import ReplicaDied, ReplicaHung
from cluster.spread import actor_record
from deployments.replica.inprocess import InProcessClient
from deployments.wire.dialer import Dialer
from deployments.wire.keepalive import DEFAULT, Keepalive
from deployments.wire.link import Link, LinkLost

log = logging.getLogger(__name__)


def _placed(actor: Any) -> bool:
    """Whether Ray has started `actor`'s process (its constructor may still run), from the
    GCS's actor table (no dashboard needed); False when that cannot be told."""
    try:
        # A worker process runs its constructor: it has a pid (a pending one has 0; its
        # NodeID is already filled in, so that tells nothing).
        return bool(actor_record(actor._actor_id.hex()).get("Pid"))
    except Exception:  # a warning too many beats none
        return False


class RayReplicaClient:
    """The client of one replica actor (`ModelReplica`, `SequenceReplica` or `StepReplica`):
    one Ray call per batch, release or generation step; the host calls what its kind uses.

    A call that has not returned `timeout_s` after it was sent (`replicas.batch_timeout_s`)
    means a hung model: a timer kills the actor, so every call on it ends (ReplicaDied:
    retried elsewhere) and that call raises ReplicaHung (not retried: `BatchTimedOut`).
    A timer, not `asyncio.wait_for`: no extra task per batch. With `link` (a dynamic model's
    replica, `replicas.link`) batches go on a direct connection once it is open
    (`deployments.wire.link`; the first as Ray calls meanwhile): its end is the replica's death,
    or after the timer, that batch's hang, as for a Ray call. A connection that ends, or
    that stops answering (`keepalive`: a host that lost power, or is cut off, sends no FIN),
    even with nothing open on it, marks the replica lost: every later call raises
    ReplicaDied at once, so its engine stops sending to it and the pool replaces it.
    """

    def __init__(self, actor: Any, index: int, timeout_s: float | None = None,
                 link: bool = False, keepalive: Keepalive | None = DEFAULT) -> None:
        self.actor = actor
        self.index = index
        self.name = f"replica-{index}"
        self.timeout_s = timeout_s
        self._stopped = False  # a batch ran past timeout_s: the actor is being killed
        self.lost: str | None = None  # why its direct connection was lost, once it was
        # batches on a direct connection (`replicas.link`), once open
        self._dialer = Dialer(self.name, keepalive, self._link_lost) if link else None

    def _link_lost(self, why: str) -> None:
        if self.lost is None and not self._stopped:
            log.error("%s is lost: %s", self.name, why)
        self.lost = why

    async def run(self, items: Any) -> tuple[Any, float]:
        if self.lost is not None:  # its host is gone or cut off: nothing more goes there
            raise ReplicaDied(f"{self.name}: its direct connection was lost ({self.lost})")
        dialer = self._dialer
        link = dialer.live() if dialer is not None else None
        if link is not None:
            return await self._call(self.actor.run, items, link=link)
        if dialer is not None and not self._stopped:
            dialer.dial(self.actor)
        return await self._call(self.actor.run, items)

    async def release(self, sequence_ids: list[Any]) -> None:
        await self._call(self.actor.release, sequence_ids)

    async def step(self, join: list[Any], leave: list[Any]) -> tuple[list[Any], float]:
        return await self._call(self.actor.step, join, leave)

    async def info(self) -> dict[str, Any]:
        return await self.actor.info.remote()

    def placed(self) -> bool:
        return _placed(self.actor)

    def stop(self) -> None:
        self._stopped = True
        try:  # an actor already dead, or on a node Ray cannot reach now: killed once it can
            ray.kill(self.actor, no_restart=True)
        finally:
            if self._dialer is not None:
                self._dialer.close()

    async def _call(self, method: Any, *args: Any, link: Link | None = None) -> Any:
        """`method(*args)` as a Ray call, or on `link` (its end is the actor's, as a Ray
        call's failure is)."""
        hung: list[float] = []  # set by the timer when this call ran past timeout_s
        timer = None if self.timeout_s is None else asyncio.get_running_loop().call_later(
            self.timeout_s, self._stop_hung, hung)
        try:
            return await (link.call(*args) if link is not None else method.remote(*args))
        except (ActorDiedError, ActorUnavailableError, RayActorError, LinkLost) as e:
            if link is not None and self._dialer is not None:
                self._dialer.drop(link)
            if hung:
                raise ReplicaHung(f"{self.name}: hung", BatchTimedOut(
                    f"the model did not finish this request's batch within "
                    f"replicas.batch_timeout_s={self.timeout_s} s on {self.name}, which was "
                    f"stopped and replaced; raise batch_timeout_s if batches run this "
                    f"long")) from e
            raise ReplicaDied(f"{self.name}: {type(e).__name__}") from e
        except RayTaskError as e:  # the model raised: hand its own exception on
            cause = e.cause if isinstance(e.cause, BaseException) else None
            raise (cause or e) from None
        finally:
            if timer is not None:
                timer.cancel()

    def _stop_hung(self, hung: list[float]) -> None:
        if self._stopped:  # being killed for an earlier batch: this one is retried
            return
        self._stopped = True
        hung.append(time.monotonic())
        log.error("%s ran a batch for more than batch_timeout_s=%s s: stopping it as hung",
                  self.name, self.timeout_s)
        self.stop()


ReplicaClient = RayReplicaClient | InProcessClient
