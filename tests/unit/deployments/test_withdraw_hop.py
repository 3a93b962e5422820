"""Rows of a block withdrawn across the hop to a batching actor (no Ray): the `Coalescer`
sends a `Withdraw` among its cancels, after the bundle that carried the block, and the
actor's engine (`ModelEngine` over a real `BatchHost` and a replica the test holds)
withdraws what of those rows is still queued; the block's answer says which rows it
carries, also through the direct connection's pickling. Hostile withdrawals (rows out of
range, unknown or unhashable keys, rows that are not a list) change nothing."""

from __future__ import annotations

import asyncio
import logging

import numpy as np

from batching import DynamicPolicy
from batching.dynamic.host import BatchHost
from batching.types import Rows
from cluster.appsettings import MetricsConfig
from cluster.config import ModelConfig
from deployments.batcher.actor import ModelEngine
from deployments.ingress.coalesce import Coalescer
from deployments.wire.bundles import Entry
from deployments.wire.link import Link, LinkServer
from deployments.wire.withdraw import Withdraw
from tests.conftest import arun as run
from tests.conftest import until

CONFIG = {"name": "sq", "transformer": "deployments.models:Square",
          "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1]}],
          "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1]}]}


class Held:
    """The replica: squares a batch once `go` is set; keeps each batch's rows."""

    name = "r0"

    def __init__(self) -> None:
        self.go = asyncio.Event()
        self.batches: list[list[float]] = []

    async def run(self, items):
        await self.go.wait()
        self.batches.append(np.asarray(items).tolist())
        return items * items, 0.0


class Engine(ModelEngine):
    """A batching actor's engine for one model, its host over the `Held` replica."""

    def __init__(self) -> None:
        super().__init__(ModelConfig.model_validate(CONFIG), 0, MetricsConfig())
        self.replica = Held()

    async def _start(self) -> None:
        self.host = BatchHost(DynamicPolicy(max_batch_size=16, max_queue_delay_s=0.0),
                              max_inflight=1)
        self.host.add_replica(self.replica)


class RayActor:
    """The actor as the Coalescer calls it through Ray; `calls`: (method, keys) in order."""

    def __init__(self, engine: Engine) -> None:
        self.calls: list[tuple[str, list]] = []
        outer = self

        class _Method:
            def __init__(self, name, fn):
                self.name, self.fn = name, fn

            def remote(self, caller_or_bundle, *args):
                keys = (args[0] if self.name == "cancel" else
                        [e.key for e in caller_or_bundle])
                outer.calls.append((self.name, list(keys)))
                return asyncio.ensure_future(self.fn(caller_or_bundle, *args))

        async def cancel(caller, keys):
            return engine.cancel(caller, keys)

        self.infer = _Method("infer", lambda bundle, caller, sent: engine.infer(
            bundle, caller, sent, None))
        self.cancel = _Method("cancel", cancel)


def f32(*values: float) -> np.ndarray:
    return np.array(values, np.float32)


def test_a_blocks_gone_rows_are_withdrawn_at_the_actor_and_the_rest_map_back():
    async def main():
        engine = Engine()
        actor = RayActor(engine)
        c = Coalescer(lambda: actor, link=False)
        busy = c.submit(f32(100.0), None, None)
        await until(lambda: engine.host is not None and engine.host.engine.inflight_batches == 1,
                    "the busy batch on the replica")
        x = np.arange(8, dtype=np.float32)
        block = c.submit(x, None, None, None, 4)  # 4 clients' requests, 2 rows each
        await until(lambda: engine.host.engine.queued_items == 8, "the block queued")
        assert c.withdraw(busy, [0]) is False  # not a block: nothing to withdraw from
        assert c.withdraw(block, np.array([2, 3, 6, 7])) is True
        await until(lambda: engine.host.engine.queued_items == 4, "its rows withdrawn")
        engine.replica.go.set()
        value, rows = await block
        await busy
        return actor.calls, engine, value, rows, x

    calls, engine, value, rows, x = run(main())
    assert [name for name, _ in calls] == ["infer", "infer", "cancel"]
    assert calls[2][1] == [Withdraw(calls[1][1][0], (2, 3, 6, 7))]
    assert engine.replica.batches == [[100.0], [0.0, 1.0, 4.0, 5.0]]
    assert rows.tolist() == [0, 1, 4, 5] and value.tolist() == (x[rows] ** 2).tolist()
    assert engine.host.outcomes == {"ok": 3, "cancelled": 2}
    assert engine.cancelled_by_caller == 0  # a withdrawal is no cancel of the request


def test_a_withdrawal_in_the_tick_of_its_block_reaches_the_actor_after_the_block():
    async def main():
        engine = Engine()
        actor = RayActor(engine)
        c = Coalescer(lambda: actor, link=False)
        c.submit(f32(100.0), None, None)
        await until(lambda: engine.host is not None and engine.host.engine.inflight_batches == 1,
                    "the busy batch on the replica")
        other = c.submit(f32(7.0), None, None)
        await until(lambda: engine.host.engine.queued_items == 1, "another request queued")
        other.cancel()  # its cancel is due before the block's flush...
        block = c.submit(f32(1, 2, 3, 4), None, None, None, 2)
        c.withdraw(block, [0, 1])  # ... and this withdrawal, after it
        await until(lambda: actor.calls[-1][0] == "cancel", "the cancels sent")
        await until(lambda: engine.host.engine.queued_items == 2, "the rows withdrawn")
        engine.replica.go.set()
        return actor.calls, await block, engine.replica.batches

    calls, (value, rows), batches = run(main())
    # one cancel call after the block's bundle: the other request's key, the block's rows
    assert [name for name, _ in calls] == ["infer", "infer", "infer", "cancel"]
    (other_key,), (block_key,) = calls[1][1], calls[2][1]
    assert calls[3][1] == [other_key, Withdraw(block_key, (0, 1))]
    assert batches == [[100.0], [3.0, 4.0]] and rows.tolist() == [2, 3]
    assert value.tolist() == [9.0, 16.0]


def test_a_withdrawal_on_the_direct_connection_and_its_answer_travel_pickled():
    async def main():
        engine = Engine()
        await engine.ensure_started()

        async def cancel(caller, keys):
            return engine.cancel(caller, keys)

        server = LinkServer(lambda bundle, caller, sent: engine.infer(bundle, caller, sent,
                                                                       None), cancel)
        host, port, token = await server.address("127.0.0.1")
        link = await Link.open_to(host, port, token)
        busy = link.call([Entry("b", f32(100.0))], "c1", None)
        await until(lambda: engine.host.engine.inflight_batches == 1, "the busy batch out")
        block = link.call([Entry("k", np.arange(6, dtype=np.float32), requests=3)], "c1", None)
        await until(lambda: engine.host.engine.queued_items == 6, "the block queued")
        link.cancel("c1", [Withdraw("k", (4, 5))])
        await until(lambda: engine.host.engine.queued_items == 4, "its rows withdrawn")
        engine.replica.go.set()
        answer, _ = await block, await busy
        link.close()
        server.close()
        return answer

    (key, value, error), = run(main())
    assert key == "k" and error is None and type(value) is Rows
    assert value.rows.tolist() == [0, 1, 2, 3] and value.value.tolist() == [0, 1, 4, 9]


def test_hostile_withdrawals_are_logged_and_change_nothing(caplog):
    async def main():
        engine = Engine()
        actor = RayActor(engine)
        c = Coalescer(lambda: actor, link=False)
        c.submit(f32(100.0), None, None)
        await until(lambda: engine.host is not None and engine.host.engine.inflight_batches == 1,
                    "the busy batch on the replica")
        block = c.submit(f32(1, 2, 3, 4), None, None, None, 2)
        await until(lambda: engine.host.engine.queued_items == 4, "the block queued")
        key = actor.calls[-1][1][0]
        with caplog.at_level(logging.WARNING, "deployments.batcher.actor"):
            found = engine.cancel(c.caller, [
                Withdraw(key, (4,)), Withdraw(key, (-1,)), Withdraw(key, "junk"),
                Withdraw(key, ((0, 1),)), Withdraw([key], (0,)), Withdraw("nope", (0,)),
                Withdraw(key, (0,))[:1], (key,)])
        queued = engine.host.engine.queued_items
        engine.replica.go.set()
        return found, queued, await block

    found, queued, answer = run(main())
    assert found == 0 and queued == 4
    assert answer.tolist() == [1.0, 4.0, 9.0, 16.0]  # whole: nothing was withdrawn
    refused = [r for r in caplog.records if "withdrawal of rows" in r.getMessage()]
    assert len(refused) == 5  # out of range (2), not a list, nested, unhashable key
