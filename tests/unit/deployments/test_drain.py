"""Draining without Ray: which ingress replicas a batching actor still serves, and the
ingress's side (503 once draining, detach from every actor, errors logged)."""

from __future__ import annotations

import asyncio
import logging

import pytest

from batching.errors import Draining, ServiceClosed, http_status
from deployments.batcher.attachments import Attachments
from deployments.ingress.drain import IngressDrain
from tests.conftest import arun as run


class _Call:
    def __init__(self, fn):
        self.fn = fn

    def remote(self, *args):
        return asyncio.ensure_future(self.fn(*args))


class FakeReplica:
    """An ingress replica's actor handle: alive, dead, or too busy to answer a ping."""

    def __init__(self, state: str = "alive") -> None:
        self.state = state

        async def ready():
            if self.state == "dead":
                raise RuntimeError("RayActorError: the actor died")
            if self.state == "busy":
                await asyncio.sleep(10)
        self.__ray_ready__ = _Call(ready)


class FakeBatcher:
    def __init__(self, drained: bool = True, fail: bool = False) -> None:
        self.attached: list = []
        self.detached: list = []

        async def attach(rid, replica):
            self.attached.append(rid)

        async def detach(rid, grace_s):
            if fail:
                raise RuntimeError("batching actor unreachable")
            self.detached.append((rid, grace_s))
            return {"drained": drained}
        self.attach, self.detach = _Call(attach), _Call(detach)


def test_the_last_live_replica_to_detach_is_told_none_is_left():
    async def main():
        a = Attachments(ping_timeout_s=0.05)
        a.attach("r1", FakeReplica())
        a.attach("r2", FakeReplica())
        assert await a.detach("r1") == 1  # r2 still uses the actor: no drain (a scale-down)
        assert await a.detach("r2") == 0
    run(main())


def test_a_replica_that_died_without_detaching_does_not_hold_the_drain_back():
    async def main():
        a = Attachments(ping_timeout_s=0.05)
        a.attach("dead", FakeReplica("dead"))
        a.attach("busy", FakeReplica("busy"))
        a.attach("me", FakeReplica())
        assert await a.detach("me") == 1  # the dead one is forgotten, the busy one kept
        a.attach("busy", FakeReplica("dead"))
        assert await a.detach("other") == 0
    run(main())


def test_a_draining_ingress_refuses_with_503_and_detaches_from_every_actor():
    async def main():
        actors = [FakeBatcher(), FakeBatcher(drained=False)]
        d = IngressDrain(lambda: actors, timeout_s=3.0)
        await d.attach()
        assert [b.attached for b in actors] == [[d.replica_id], [d.replica_id]]
        d.check()  # not draining: nothing raised
        await d.finish()
        assert [b.detached for b in actors] == [[(d.replica_id, 3.0)], [(d.replica_id, 3.0)]]
        with pytest.raises(Draining, match="shutting down") as e:
            d.check()
        assert isinstance(e.value, ServiceClosed) and http_status(e.value) == 503
    run(main())


def test_a_batching_actor_shared_by_a_group_of_models_is_attached_and_drained_once():
    """Every model of a `batcher.group` names the same actor (each through a handle of its
    own, the same actor id): it is attached once and detached once, not drained twice."""
    async def main():
        shared, other = FakeBatcher(), FakeBatcher()
        twin = FakeBatcher()
        # two handles of one actor (the same id), and another actor
        shared._actor_id, twin._actor_id, other._actor_id = "a1", "a1", "a2"
        twin.attach, twin.detach = shared.attach, shared.detach
        d = IngressDrain(lambda: [shared, other, twin], timeout_s=3.0)
        await d.attach()
        await d.finish()
        return d, shared, other

    d, shared, other = run(main())
    assert shared.attached == other.attached == [d.replica_id]
    assert shared.detached == other.detached == [(d.replica_id, 3.0)]


def test_a_failed_detach_is_logged_and_the_others_still_drain(caplog):
    actors = [FakeBatcher(fail=True), FakeBatcher()]

    async def main():
        d = IngressDrain(lambda: actors, timeout_s=1.0)
        await d.finish()

    with caplog.at_level(logging.WARNING, logger="deployments.ingress.drain"):
        run(main())
    assert "draining a batching actor failed" in caplog.text
    assert len(actors[1].detached) == 1
