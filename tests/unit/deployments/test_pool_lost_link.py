"""A replica whose direct connection is lost (`deployments.replica.pool`): the batch open on it
fails with ReplicaDied (its engine sends it once more elsewhere, `BatchHost`), every
later batch fails so at once, without a Ray call to a replica that may be cut off, and
the pool stops it when it replaces it (a partitioned replica may still live). The
connection is judged at explicit times (`Link.check`); no Ray, no sleep."""

from __future__ import annotations

import asyncio

import pytest

from batching.loop import ReplicaDied
from deployments.replica.client import RayReplicaClient
from deployments.replica.pool import ReplicaPool
from deployments.wire.keepalive import Keepalive
from tests.conftest import arun as run
from tests.conftest import until
from tests.unit.deployments.test_link import Replica
from tests.unit.deployments.test_replica_threads import config

K = Keepalive(0.5, 2.0)


def test_a_silent_link_fails_its_batch_and_every_later_one_at_once():
    async def main():
        replica = Replica(workers=1)
        client = RayReplicaClient(replica, 0, timeout_s=None, link=True, keepalive=K)
        await client.run([1])  # a Ray call; the link opens meanwhile
        await until(lambda: client._dialer.link is not None, "the link open")
        link = client._dialer.link
        replica.gate.clear()
        batch = asyncio.ensure_future(client.run([2]))
        await until(lambda: replica.started[-1:] == [[2]], "the batch at the replica")
        link.check(link.heartbeat.heard_s + K.dead_s)  # nothing heard since, a batch open
        errors = await asyncio.gather(batch, client.run([3]), return_exceptions=True)
        replica.gate.set()
        return errors, client, replica

    errors, client, replica = run(main())
    assert all(isinstance(e, ReplicaDied) for e in errors)
    assert "direct connection was lost" in str(errors[1]) and client.lost
    assert replica.ray_runs == 1  # the later batch was not sent as a Ray call instead


def test_a_replaced_replica_is_stopped(monkeypatch):
    stopped: list[str] = []

    class Old:
        name, index = "replica-0", 0

        def stop(self) -> None:
            stopped.append(self.name)
            raise RuntimeError("its node cannot be reached")  # logged, not raised

    async def main():
        pool = ReplicaPool(config(read_ahead=None), host=None)
        served: list[int] = []

        async def serve(index, client):
            served.append(index)

        monkeypatch.setattr(pool, "_create", lambda: (1, object()))
        monkeypatch.setattr(pool, "_serve", serve)
        pool.replaced(Old())
        await until(lambda: served, "the replacement started")
        return served

    assert run(main()) == [1] and stopped == ["replica-0"]


@pytest.mark.parametrize("ping_s,dead_s", [(0.5, 0.5), (1.0, 0.2)])
def test_a_dead_time_not_past_the_ping_time_is_refused(ping_s, dead_s):
    with pytest.raises(ValueError, match="link_dead_s"):
        config(link_ping_s=ping_s, link_dead_s=dead_s)
