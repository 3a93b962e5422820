"""The direct connection to a batching actor (`deployments.wire.link`) over a real loopback
socket (no Ray): frames both ways, errors, order of a cancel after its bundle, what ends
a connection (a wrong token, a frame too large, either side going away); and the
`Coalescer` on it: the first bundle as a Ray call while the connection opens, the next
on it, each cancel the way its request went, and a connection that ends failing its
bundles with what Ray says of the actor."""

from __future__ import annotations

import asyncio
import pickle
import socket
import struct

import pytest

from batching.errors import InvalidRequest, WorkerDied
from deployments.ingress.coalesce import BatcherStopped, Coalescer
from deployments.wire.link import HEAD, INFER, MAX_FRAME, Link, LinkLost, LinkServer
from tests.conftest import arun as run
from tests.conftest import until


class Actor:
    """What the link serves: infer answers x -> 10x per entry, or waits while `hold`."""

    def __init__(self) -> None:
        self.seen: list[tuple] = []  # ("infer", keys) / ("cancel", keys), in order
        self.hold = asyncio.Event()
        self.hold.set()
        self.cancelled_calls = 0

    async def infer(self, bundle, caller=None, sent=None):
        self.seen.append(("infer", [e[0] for e in bundle]))
        if any(e[1] == "bad" for e in bundle):
            raise InvalidRequest("a bad bundle")
        try:
            await self.hold.wait()
        except asyncio.CancelledError:
            self.cancelled_calls += 1
            raise
        return [(e[0], [x * 10 for x in e[1]], None) for e in bundle]

    async def cancel(self, caller, keys):
        self.seen.append(("cancel", list(keys)))
        return len(keys)


async def _pair(actor: Actor) -> tuple[LinkServer, Link]:
    server = LinkServer(actor.infer, actor.cancel)
    host, port, token = await server.address("127.0.0.1")
    return server, await Link.open_to(host, port, token)


def test_bundles_come_back_with_their_answers_and_errors_as_raised():
    async def main():
        actor = Actor()
        server, link = await _pair(actor)
        answers = await asyncio.gather(*(link.call([(i, [i, i + 1])], "c", None)
                                         for i in range(50)))
        with pytest.raises(InvalidRequest, match="a bad bundle"):
            await link.call([(99, "bad")], "c", None)
        link.close()
        server.close()
        return answers

    answers = run(main())
    assert answers == [[(i, [10 * i, 10 * i + 10], None)] for i in range(50)]


def test_a_cancel_sent_after_its_bundle_is_seen_after_it():
    async def main():
        actor = Actor()
        actor.hold.clear()
        server, link = await _pair(actor)
        fut = link.call([(1, [1]), (2, [2])], "c", None)
        link.cancel("c", [2])
        await until(lambda: len(actor.seen) == 2, "both frames")
        actor.hold.set()
        await fut
        server.close()
        return actor.seen

    assert run(main()) == [("infer", [1, 2]), ("cancel", [2])]


def test_a_caller_that_goes_away_has_its_open_calls_cancelled_at_the_actor():
    async def main():
        actor = Actor()
        actor.hold.clear()
        server, link = await _pair(actor)
        fut = link.call([(1, [1])], "c", None)
        await until(lambda: actor.seen, "the bundle at the actor")
        link.close()
        with pytest.raises(LinkLost):
            await fut
        await until(lambda: actor.cancelled_calls == 1, "the call cancelled")
        server.close()

    run(main())


def test_an_actor_that_goes_away_fails_every_open_call_with_link_lost():
    async def main():
        actor = Actor()
        actor.hold.clear()
        server, link = await _pair(actor)
        futs = [link.call([(i, [i])], "c", None) for i in range(3)]
        await until(lambda: len(actor.seen) == 3, "the bundles at the actor")
        server.close()
        results = await asyncio.gather(*futs, return_exceptions=True)
        late = await asyncio.gather(link.call([(9, [9])], "c", None), return_exceptions=True)
        return results + late

    results = run(main())
    assert all(isinstance(r, LinkLost) and isinstance(r, WorkerDied) for r in results)


@pytest.mark.parametrize("first", [b"x" * 16, None], ids=["wrong-token", "oversized-frame"])
def test_a_wrong_token_or_a_frame_past_the_limit_ends_the_connection_unread(first):
    async def main():
        actor = Actor()
        server = LinkServer(actor.infer, actor.cancel)
        host, port, token = await server.address("127.0.0.1")
        sock = socket.create_connection((host, port), timeout=5)
        payload = pickle.dumps(([(1, [1])], "c", None), protocol=5)  # a real bundle
        frame = HEAD.pack(len(payload), 1, INFER) + payload
        if first is None:  # the token, then a length past MAX_FRAME
            sock.sendall(token + struct.pack("<IQB", MAX_FRAME + 1, 1, INFER) + b"junk")
        else:
            sock.sendall(first + frame)
        data = await asyncio.to_thread(sock.recv, 100)
        sock.close()
        server.close()
        return data, actor.seen

    data, seen = run(main())
    assert data == b"" and seen == []  # closed, nothing run


class LinkedActor:
    """A batching actor as the Coalescer sees it: Ray-call methods (futures) and a real
    link; `dead_because` makes `ready` raise as Ray does for a dead actor."""

    def __init__(self, actor: Actor) -> None:
        self.actor, self.server = actor, LinkServer(actor.infer, actor.cancel)
        self.ray_bundles: list = []
        self.ray_cancels: list = []
        self.dead_because: str | None = None
        outer = self

        class _M:
            def __init__(self, fn):
                self.fn = fn

            def remote(self, *args):
                return asyncio.ensure_future(self.fn(*args))

        async def infer(bundle, caller, sent):
            outer.ray_bundles.append([e[0] for e in bundle])
            return await actor.infer(bundle, caller, sent)

        async def cancel(caller, keys):
            outer.ray_cancels.append(list(keys))
            return await actor.cancel(caller, keys)

        async def ready():
            if outer.dead_because:
                raise RuntimeError(outer.dead_because)
            return True

        self.infer, self.cancel, self.ready = _M(infer), _M(cancel), _M(ready)
        self.link_address = _M(lambda node: self.server.address("127.0.0.1"))


def test_the_coalescer_sends_on_the_link_once_open_and_cancels_the_way_each_went():
    async def main():
        actor = Actor()
        fake = LinkedActor(actor)
        c = Coalescer(lambda: fake, bundle_items=4)
        actor.hold.clear()
        first = c.submit([1], None, None)  # a Ray call; the link opens meanwhile
        await until(lambda: c._dialer.link is not None, "the link open")
        second = c.submit([2], None, None)  # on the link
        await until(lambda: len(actor.seen) == 2, "both bundles at the actor")
        first.cancel()
        second.cancel()
        await until(lambda: len(actor.seen) == 4, "both cancels at the actor")
        actor.hold.set()
        third = await c.submit([3], None, None)
        return fake, actor.seen, third, c.linked_bundles

    fake, seen, third, linked = run(main())
    assert fake.ray_bundles == [[0]] and linked == 2 and third == [30]
    assert fake.ray_cancels == [[0]]  # the Ray call's request cancelled by Ray
    assert ("cancel", [1]) in seen  # the link's on the link


@pytest.mark.parametrize("why", ["The actor died because it was killed by `ray.kill`.",
                                 "the actor's process exited", None])
def test_a_link_that_ends_fails_its_bundles_as_ray_says_of_the_actor(why):
    async def main():
        actor = Actor()
        fake = LinkedActor(actor)
        c = Coalescer(lambda: fake, bundle_items=4)
        await c.submit([1], None, None)
        await until(lambda: c._dialer.link is not None, "the link open")
        actor.hold.clear()
        fut = c.submit([2], None, None)
        await until(lambda: len(actor.seen) == 2, "the bundle at the actor")
        fake.dead_because = why
        fake.server.close()
        try:
            await fut
        except Exception as e:
            return e

    error = run(main())
    assert isinstance(error, WorkerDied)
    assert isinstance(error, BatcherStopped) == (why is not None and "ray.kill" in why)
    assert ("connection" in str(error)) == (why is None)


class Replica:
    """A replica actor as `RayReplicaClient` sees it: `run` as a Ray call (a future) and a
    threaded link server, as `ModelReplica` has; `run` doubles its items, raises for
    "bad", and blocks while `gate` is clear."""

    def __init__(self, workers: int = 2) -> None:
        import threading

        from deployments.replica.link_server import ThreadedLinkServer

        self.gate = threading.Event()
        self.gate.set()
        self.ray_runs = 0
        self.started: list = []  # the batches `run` was handed, in order
        self.killed = False
        self.pinned: set[int] = set()  # threads the server's initializer ran on
        self.ran_on: list[int] = []  # the thread of each batch
        self.running = self.most_at_once = 0
        self.server = ThreadedLinkServer(
            self._run, workers=workers,
            initializer=lambda: self.pinned.add(threading.get_ident()))
        outer = self

        class _M:
            def __init__(self, fn):
                self.fn = fn

            def remote(self, *args):
                return asyncio.ensure_future(asyncio.to_thread(self.fn, *args))

        def ray_run(items):
            outer.ray_runs += 1
            return outer._run(items)

        self.run = _M(ray_run)
        self.link_address = _M(lambda node: self.server.address("127.0.0.1"))

    def _run(self, items):
        import threading

        if items == "bad":
            raise ValueError("the model broke on this batch")
        self.running += 1
        self.most_at_once = max(self.most_at_once, self.running)
        self.ran_on.append(threading.get_ident())
        self.started.append(list(items))
        self.gate.wait(10)
        self.running -= 1
        return [2 * x for x in items], 0.001

    def kill(self) -> None:  # as ray.kill: the process and its sockets go
        self.killed = True
        self.server.close()


def test_a_replica_that_reads_ahead_takes_its_batches_on_the_link_with_the_models_errors():
    from deployments.replica.client import RayReplicaClient

    async def main():
        replica = Replica()
        client = RayReplicaClient(replica, 0, timeout_s=None, link=True)
        first = await client.run([1, 2])  # a Ray call; the link opens meanwhile
        await until(lambda: client._dialer.link is not None, "the link open")
        rest = await asyncio.gather(*(client.run([i]) for i in range(20)))
        with pytest.raises(ValueError, match="broke"):
            await client.run("bad")
        return first, rest, replica.ray_runs

    first, rest, ray_runs = run(main())
    assert first == ([2, 4], 0.001) and rest == [([2 * i], 0.001) for i in range(20)]
    assert ray_runs == 1


def test_a_replica_that_does_not_read_ahead_runs_its_linked_batches_one_by_one_in_order():
    """A CPU replica (one batch at a time, no device thread): the link runs each batch on
    its own loop's thread, which the replica's initializer pinned, in the order sent."""
    from deployments.replica.client import RayReplicaClient

    async def main():
        replica = Replica(workers=1)
        client = RayReplicaClient(replica, 0, timeout_s=None, link=True)
        await client.run([0])  # a Ray call; the link opens meanwhile
        await until(lambda: client._dialer.link is not None, "the link open")
        replica.ran_on.clear()
        replica.gate.clear()  # the first batch holds: the rest queue behind it, in order
        calls = [asyncio.ensure_future(client.run([i])) for i in range(1, 11)]
        await until(lambda: replica.started[-1:] == [[1]], "the first linked batch running")
        replica.gate.set()
        return await asyncio.gather(*calls), replica

    answers, replica = run(main())
    assert answers == [([2 * i], 0.001) for i in range(1, 11)]
    assert replica.started[1:] == [[i] for i in range(1, 11)] and replica.most_at_once == 1
    assert len(set(replica.ran_on)) == 1 and replica.ran_on[0] in replica.pinned


@pytest.mark.parametrize("hang", [False, True], ids=["died", "hung"])
def test_a_replica_gone_from_the_link_is_its_death_or_this_batchs_hang(hang):
    from batching.loop import ReplicaDied, ReplicaHung
    from deployments.replica.client import RayReplicaClient

    async def main():
        replica = Replica()
        client = RayReplicaClient(replica, 0, link=True)
        client.stop = lambda: (replica.kill(), client._dialer.close())  # as ray.kill does
        await client.run([1])
        await until(lambda: client._dialer.link is not None, "the link open")
        client.timeout_s = 0.3 if hang else None  # from here: the first is not judged
        replica.gate.clear()
        batch = asyncio.ensure_future(client.run([2]))
        await until(lambda: replica.started[-1:] == [[2]], "the batch with the replica", 30)
        if not hang:
            replica.kill()
        try:
            await batch
        except ReplicaDied as e:
            return e
        finally:
            replica.gate.set()

    error = run(main(), 60)
    assert isinstance(error, ReplicaHung if hang else ReplicaDied)
    if hang:
        assert "batch_timeout_s" in str(error.error)


def test_a_connection_that_never_sends_the_token_is_closed(monkeypatch):
    import deployments.wire.link as link_module

    monkeypatch.setattr(link_module, "TOKEN_WAIT_S", 0.2)

    async def main():
        actor = Actor()
        server = LinkServer(actor.infer, actor.cancel)
        host, port, _ = await server.address("127.0.0.1")
        sock = socket.create_connection((host, port), timeout=5)
        sock.sendall(b"\x00" * 7)  # a few bytes, never the whole token
        data = await asyncio.to_thread(sock.recv, 100)
        sock.close()
        await until(lambda: not server.connections, "the connection dropped")
        server.close()
        return data

    assert run(main()) == b""


def test_fuzzed_bytes_with_and_without_the_token_run_nothing_and_spare_the_callers():
    """300 random byte strings (a fixed seed), half after the right token, each on its own
    connection: nothing runs that was not a whole frame of a real bundle, every such
    connection ends or waits harmlessly, and a real caller beside them gets its answers."""
    import random

    rng = random.Random(20261126)

    async def main():
        actor = Actor()
        server = LinkServer(actor.infer, actor.cancel)
        host, port, token = await server.address("127.0.0.1")
        caller = await Link.open_to(host, port, token)

        def one(i: int) -> None:
            junk = rng.randbytes(rng.choice([1, 5, 13, 40, 300, 5000]))
            if i % 3 == 0:  # a header that claims a short payload of junk
                junk = struct.pack("<IQB", len(junk), i, rng.choice([1, 2, 3, 4, 9])) + junk
            sock = socket.create_connection((host, port), timeout=5)
            try:
                sock.sendall((token if i % 2 else b"") + junk)
                sock.shutdown(socket.SHUT_WR)
                sock.settimeout(1.0)
                while sock.recv(65536):
                    pass
            except (TimeoutError, ConnectionResetError):
                pass
            finally:
                sock.close()

        for i in range(300):
            await asyncio.to_thread(one, i)
            if i % 50 == 0:  # the real caller, all along
                assert await caller.call([(i, [i])], "c", None) == [(i, [10 * i], None)]
        answers = await asyncio.gather(*(caller.call([(k, [k])], "c", None) for k in range(20)))
        caller.close()
        server.close()
        return answers, actor.seen

    answers, seen = run(main())
    assert answers == [[(k, [10 * k], None)] for k in range(20)]
    assert all(kind == "infer" for kind, _ in seen)  # only the real caller's bundles ran
    assert len(seen) == 6 + 20


def test_a_stand_in_with_no_address_is_not_dialled(caplog):
    """The engine in the ingress stands in for a batching actor (`client._ViaIngress`): it
    has no `link_address`, so no connection is tried and nothing is said in the log."""
    from deployments.ingress.client import _ViaIngress
    from deployments.wire.dialer import Dialer

    async def main() -> Dialer:
        dialer = Dialer("the batching actor")
        dialer.dial(_ViaIngress(handle=None, model="m"))
        await asyncio.sleep(0)
        return dialer

    with caplog.at_level("DEBUG", logger="deployments"):
        dialer = asyncio.run(main())
    assert dialer._opening is None and dialer.live() is None
    assert "no direct connection" not in caplog.text
