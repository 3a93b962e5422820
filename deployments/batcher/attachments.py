"""The batching actor's side of draining (`deployments.ingress.drain` tells the whole
story): which ingress replicas use this actor, and whether a live one is left.

An ingress replica that died without detaching is found by asking each remaining one
whether it is alive; one that is merely busy counts as alive, so a slow replica never
starts a drain it still needs.
"""

from __future__ import annotations

import asyncio
from typing import Any


class Attachments:
    """The batching actor's side: which ingress replicas use it, and whether one is left."""

    def __init__(self, ping_timeout_s: float = 2.0) -> None:
        self._replicas: dict[str, Any] = {}
        self.ping_timeout_s = ping_timeout_s

    def __len__(self) -> int:
        return len(self._replicas)

    def attach(self, replica_id: str, replica: Any) -> None:
        self._replicas[replica_id] = replica

    async def detach(self, replica_id: str) -> int:
        """Forget `replica_id`, and every other replica that no longer answers; how many
        live ones are left."""
        self._replicas.pop(replica_id, None)
        await self._prune()
        return len(self._replicas)

    async def _prune(self) -> None:
        async def alive(handle: Any) -> bool:
            if handle is None:
                return True  # cannot ask: assume it still uses us
            try:
                await asyncio.wait_for(handle.__ray_ready__.remote(), self.ping_timeout_s)
            except asyncio.TimeoutError:
                return True  # busy, not dead
            except Exception:  # RayActorError: that replica is gone without detaching
                return False
            return True

        ids = list(self._replicas)
        answers = await asyncio.gather(*(alive(self._replicas[i]) for i in ids))
        for rid, ok in zip(ids, answers):
            if not ok:
                self._replicas.pop(rid, None)
