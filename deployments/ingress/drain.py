"""Draining on delete and redeploy: finish what was accepted, refuse what comes after.

How Ray Serve 2.60 stops an application version (read in `ray/serve/_private/`):
1. the controller marks the version's replicas STOPPING and routes no new request to
   them; each replica runs `perform_graceful_shutdown` (`replica.py`): it waits until
   its ongoing requests finish (polling every `graceful_shutdown_wait_loop_s`),
   quiesces (rejects late handle-path requests, so routers retry elsewhere), then
   calls the deployment's `__del__` (async allowed);
2. the controller force-kills a replica `graceful_shutdown_timeout_s` after asking it
   to stop, `__del__` included;
3. deployment-scoped actors (the batching actors) live as long as any replica of their
   code version exists, in any state; once the last one is gone the controller
   `ray.kill`s them (`deployment_state.py`, `stop_deployment_actors_if_needed`): no
   hook runs in them.
So HTTP and handle requests in flight at an ingress replica finish on their own, but
requests a `RaybatchClient` sent straight to a batching actor would die with it. The
drain therefore runs in the ingress's `__del__`, the last hook before the kill: each
ingress replica attached itself to its batching actors when it started (and again
every `HEARTBEAT_S`, so an actor Serve recreated learns who uses it); on `__del__` it
detaches, and the actor that loses its last live ingress replica drains: it refuses
new requests with `Draining` (503; nothing ran, so `RaybatchClient` sends them again
to the new version) and runs everything it accepted, up to `drain_timeout_s`, before
`__del__` returns and Serve kills it. A replica removed by a scale-down detaches too,
but others are still attached, so nothing drains.

`IngressDrain` is the ingress's side: `begin()` makes every new request a 503 at once
(`check()`), `finish()` detaches and waits for the drain. The actor's side is
`deployments.batcher.attachments`.
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from collections.abc import Callable
from typing import Any

from batching.errors import Draining
from batching.loop import detached_task

log = logging.getLogger(__name__)
HEARTBEAT_S = 5.0


class IngressDrain:
    """One ingress replica's attachment to its batching actors.

    `actors()` returns the current handles of every batching actor the replica uses.
    """

    def __init__(self, actors: Callable[[], list[Any]], timeout_s: float,
                 replica: Any = None) -> None:
        self._actors = actors
        self.timeout_s = timeout_s
        self.replica_id = uuid.uuid4().hex
        self._replica = replica  # this replica's actor handle: batching actors ping it
        self.draining = False
        self._heartbeat: asyncio.Task | None = None

    async def attach(self) -> None:
        """Tell every batching actor this replica uses it; repeated every HEARTBEAT_S."""
        await self._attach_all()
        if self._heartbeat is None:
            self._heartbeat = detached_task(self._beat())

    def _each_actor(self) -> list[Any]:
        """Every batching actor once: models of one `batcher.group` share theirs, and a
        second detach would drain it again."""
        return list({getattr(a, "_actor_id", id(a)): a for a in self._actors()}.values())

    async def _attach_all(self) -> None:
        calls = [a.attach.remote(self.replica_id, self._replica) for a in self._each_actor()]
        for result in await asyncio.gather(*calls, return_exceptions=True):
            if isinstance(result, Exception):
                log.warning("attaching to a batching actor failed: %r", result)

    async def _beat(self) -> None:
        while not self.draining:
            await asyncio.sleep(HEARTBEAT_S)
            try:
                await self._attach_all()
            except Exception as e:  # an actor being recreated: the next beat finds it
                log.warning("attaching to the batching actors failed: %r", e)

    def begin(self) -> None:
        """From now on every new request is refused with 503 (`check`)."""
        self.draining = True

    def check(self) -> None:
        """Raise `Draining` (503, Retry-After) once the replica is draining."""
        if self.draining:
            raise Draining("this server is shutting down (redeploy or delete): retry")

    async def finish(self) -> None:
        """Detach from every batching actor; one that has no ingress replica left drains
        (finishes what it accepted, up to `timeout_s`) before this returns."""
        self.begin()
        if self._heartbeat is not None:
            self._heartbeat.cancel()
        try:
            actors = self._each_actor()
        except Exception as e:  # the actors are gone already: nothing left to drain
            log.warning("no batching actor to drain: %r", e)
            return
        calls = [a.detach.remote(self.replica_id, self.timeout_s) for a in actors]
        try:
            results = await asyncio.wait_for(
                asyncio.gather(*calls, return_exceptions=True), self.timeout_s + 5)
        except asyncio.TimeoutError:
            log.error("the batching actors did not drain within %.1f s", self.timeout_s + 5)
            return
        for result in results:
            if isinstance(result, Exception):
                log.warning("draining a batching actor failed: %r", result)
            elif result.get("drained"):
                log.info("batching actor drained: %s", result)
