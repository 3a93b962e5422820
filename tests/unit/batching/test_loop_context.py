"""A batch is nobody's: the hosts run their work in no submitter's context.

A task copies the context of whoever creates it. In a Ray actor that context
names the request (`ray._raylet.async_task_id`), so a batch call made in a
task that inherited one request's context is that request's Ray child: Serve
cancelling the request (its HTTP client hung up) cancels the call, and every
batch-mate fails with it. Here a `ContextVar` stands for that id: each request
is submitted from its own task with the variable set, as a Serve handler would
be, and every replica call must see it unset. No Ray, no real time.
"""

from __future__ import annotations

import asyncio
import contextvars

import numpy as np

from batching import DynamicPolicy
from batching.dynamic.host import BatchHost
from batching.iterative.generative import Generator, StepModel
from batching.iterative.host import IterativeHost
from batching.iterative.policy import IterativePolicy
from batching.iterative.scheduler import GenerateRequest
from batching.sequence.batcher import SequenceRequest
from batching.sequence.host import SequenceHost
from batching.sequence.policy import SequencePolicy
from batching.sequence.stateful import StateStore
from batching.types import Request
from deployments.models.stateful import Accumulator

REQUEST = contextvars.ContextVar("request", default=None)  # stands for async_task_id


class Clock:
    now = 0.0

    def __call__(self) -> float:
        return self.now


def as_request(name: str, coro_fn):
    """Run `coro_fn()` in a task of its own whose context names request `name`."""
    ctx = contextvars.copy_context()
    ctx.run(REQUEST.set, name)
    return ctx.run(asyncio.ensure_future, coro_fn())


async def spin(turns: int = 20) -> None:
    for _ in range(turns):
        await asyncio.sleep(0)


class DynamicReplica:
    name = "d"

    def __init__(self) -> None:
        self.seen: list = []

    async def run(self, items):
        self.seen.append(REQUEST.get())
        await asyncio.sleep(0)
        return [x * x for x in items], 0.001


class SequenceReplica:
    name = "s"

    def __init__(self) -> None:
        self.store = StateStore(Accumulator())
        self.seen: list = []

    async def run(self, batch):
        self.seen.append(REQUEST.get())
        await asyncio.sleep(0)
        return self.store.run(batch), 0.001

    async def release(self, sequence_ids) -> None:
        self.seen.append(REQUEST.get())
        self.store.release(sequence_ids)


class Echo(StepModel):
    """Continues a prompt with its own characters, one per step, then eos."""

    eos_id = 0

    def encode(self, text):
        return [ord(c) for c in text]

    def decode(self, tokens):
        return "".join(map(chr, tokens))

    def prefill(self, prompts):
        return [(self.decode(p), 0) for p in prompts]

    def step(self, states):
        tokens = [ord(s[i]) if i < len(s) else 0 for s, i in states]
        return tokens, [(s, i + 1) for s, i in states]


class StepReplica:
    name = "i"

    def __init__(self) -> None:
        self.gen = Generator(Echo())
        self.seen: list = []

    async def step(self, join, leave):
        self.seen.append(REQUEST.get())
        await asyncio.sleep(0)
        return self.gen.step(join, leave), 0.001


def test_dynamic_batches_run_in_no_submitters_context():
    async def main():
        replica = DynamicReplica()
        host = BatchHost(DynamicPolicy(max_batch_size=4), max_inflight=2, clock=Clock(),
                         on_replica_died=lambda c: None)
        host.add_replica(replica)

        async def one(i):
            assert REQUEST.get() == f"r{i}"  # the request's own task does see it
            return await host.submit(Request(i, (i,), single=True))

        tasks = [as_request(f"r{i}", lambda i=i: one(i)) for i in range(10)]
        results = await asyncio.wait_for(asyncio.gather(*tasks), 5)
        assert results == [i * i for i in range(10)]
        assert len(replica.seen) >= 3 and set(replica.seen) == {None}, replica.seen
    asyncio.run(main())


def test_sequence_batches_and_releases_run_in_no_submitters_context():
    async def main():
        replica = SequenceReplica()
        host = SequenceHost(SequencePolicy(max_batch_size=4), max_inflight=2, clock=Clock(),
                            on_replica_died=lambda c: None)
        host.add_replica(replica)

        async def seq(sid):
            outs = []
            for i in range(3):
                x = np.array([[sid + i]], np.int32)
                out = await host.submit(SequenceRequest(f"{sid}/{i}", sid, x, i == 0, i == 2))
                outs.append(int(np.asarray(out).ravel()[0]))
            return outs

        tasks = [as_request(f"s{sid}", lambda sid=sid: seq(sid)) for sid in range(1, 6)]
        got = await asyncio.wait_for(asyncio.gather(*tasks), 5)
        assert got == [[s, 2 * s + 1, 3 * s + 3] for s in range(1, 6)]
        await spin()
        assert len(replica.seen) >= 3 and set(replica.seen) == {None}, replica.seen
    asyncio.run(main())


def test_generation_steps_run_in_no_submitters_context():
    async def main():
        replica = StepReplica()
        host = IterativeHost(IterativePolicy(max_active=4), clock=Clock(),
                             on_replica_died=lambda c: None)
        host.add_replica(replica)

        async def gen(text):
            return (await host.submit(GenerateRequest(text, text)).result()).text

        tasks = [as_request(t, lambda t=t: gen(t)) for t in ("abc", "hello", "xy")]
        assert await asyncio.wait_for(asyncio.gather(*tasks), 5) == ["abc", "hello", "xy"]
        assert len(replica.seen) >= 5 and set(replica.seen) == {None}, replica.seen
    asyncio.run(main())


def test_detached_task_and_callbacks_carry_nothing_of_their_creator():
    from batching.loop import detached, detached_task

    async def main():
        REQUEST.set("creator")
        seen = []

        async def probe():
            seen.append(REQUEST.get())

        await detached_task(probe())
        done = asyncio.Event()
        asyncio.get_running_loop().call_soon(lambda: (seen.append(REQUEST.get()), done.set()),
                                             context=detached())
        await done.wait()
        assert seen == [None, None] and REQUEST.get() == "creator"
    asyncio.run(main())
