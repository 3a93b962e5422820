"""`batcher.placement: ingress` for stateful and generative models, without Ray.

`IngressPlacement` runs the model's engine in this process; a `PoolFactory` of
in-process replicas (a real `StateStore` over the Accumulator, a real
`Generator` over TinyLM, stepped on the event loop) stands in for the
`ReplicaPool`, so what reaches the route is what the real replicas would answer.
No sleeps: the tests turn the event loop (`spin`) until the host has stepped.
"""

from __future__ import annotations

import asyncio
import contextvars

import numpy as np
import pytest

from batching.errors import (
    DeadlineExceeded,
    InvalidRequest,
    QueueFull,
    ServiceClosed,
    UnknownSequence,
)
from batching.iterative.generative import Generator
from batching.iterative.host import LocalStepClient
from batching.sequence.stateful import StateStore
from cluster.config import ModelConfig, import_object
from deployments.ingress.placement import IngressPlacement
from deployments.wire.generation import collect
from tests.conftest import arun as run

ACCUMULATOR = {
    "name": "acc", "transformer": "deployments.models:Accumulator",
    "inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [-1, 1]}],
    "outputs": [{"name": "OUTPUT0", "datatype": "INT32", "shape": [-1, 1]}],
    "batching": {"kind": "sequence", "strategy": "direct", "max_batch_size": 8},
    "batcher": {"placement": "ingress"},
}
TINYLM = {
    "name": "lm", "transformer": "deployments.models:TinyLM",
    "inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [-1]}],
    "outputs": [{"name": "text_output", "datatype": "BYTES", "shape": [-1]}],
    "batching": {"kind": "iterative", "max_active": 4, "max_step_tokens": 1024},
    "batcher": {"placement": "ingress"},
}


class _StoreClient:
    """A sequence replica in this process: the model's states in a real StateStore."""

    def __init__(self, model) -> None:
        self.name = "local-0"
        self.store = StateStore(model)
        self.released: list = []

    async def run(self, batch):
        return self.store.run(batch), 0.0

    async def release(self, sequence_ids: list) -> None:
        self.released += sequence_ids
        self.store.release(sequence_ids)


class InProcessPool:
    """A `PoolFactory`: one replica of the model, in this process."""

    def __init__(self, config: ModelConfig, host, record_metrics: bool = False) -> None:
        self.config, self.host = config, host
        self.client = None

    async def start(self) -> None:
        model = import_object(self.config.transformer)(**self.config.init_kwargs)
        model.setup("cpu")
        if self.config.batching.kind == "sequence":
            self.client = _StoreClient(model)
        else:
            self.client = LocalStepClient(Generator(model), thread=False)
        self.host.add_replica(self.client)

    def replaced(self, client) -> None:
        raise AssertionError("no replica dies here")

    async def info(self) -> list[dict]:
        return [{"name": self.client.name, "state": "ALIVE"}]


def backend(model: dict, **changes) -> IngressPlacement:
    config = ModelConfig.model_validate({**model, **changes})
    return IngressPlacement(config, None, 1, make_pool=InProcessPool)


async def spin(turns: int = 50) -> None:
    for _ in range(turns):
        await asyncio.sleep(0)


def x(v: int) -> dict:
    return {"INPUT0": np.array([[v]], np.int32)}


# -- sequences ---------------------------------------------------------------------------
def test_sequences_run_in_the_ingress_engine_each_with_its_own_state():
    async def main():
        b = backend(ACCUMULATOR)
        await b.start()
        route = b.route
        a = await route.infer(x(5), {"sequence_id": 7, "sequence_start": True})
        c = await route.infer(x(100), {"sequence_id": "s", "sequence_start": True})
        a2, c2 = await asyncio.gather(
            route.infer(x(2), {"sequence_id": 7, "sequence_end": True}),
            route.infer(x(1), {"sequence_id": "s"}))
        with pytest.raises(UnknownSequence):  # ended: its state is gone
            await route.infer(x(1), {"sequence_id": 7})
        with pytest.raises(InvalidRequest, match="sequence_id"):
            await route.infer(x(1))
        return [int(o["OUTPUT0"][0, 0]) for o in (a, c, a2, c2)], await b.stats()

    outs, stats = run(main())
    assert outs == [5, 100, 7, 101]
    assert (stats["kind"], stats["placement"], stats["open_requests"]) == (
        "sequence", "ingress", 0)


def test_a_client_bundle_of_sequence_steps_is_answered_entry_by_entry():
    """What `RaybatchClient` sends through the handle (`Ingress.infer_entries`)."""
    one = np.array([[3]], np.int32)

    async def main():
        b = backend(ACCUMULATOR)
        first = await b.infer_entries([("a", one, None, None, (1, True, False)),
                                       ("b", one, None, None, (2, False, False))])
        second = await b.infer_entries([("c", one, None, None, (1, False, True))])
        return first, second

    first, second = run(main())
    by_key = {k: (v, e) for k, v, e in first + second}
    assert int(np.asarray(by_key["a"][0]).ravel()[0]) == 3
    assert isinstance(by_key["b"][1], UnknownSequence)  # never started: fails alone
    assert int(np.asarray(by_key["c"][0]).ravel()[0]) == 6


# -- generations -------------------------------------------------------------------------
def test_concurrent_generations_stream_straight_from_the_host_each_its_own_text():
    prompts = [("abc" * (i + 1), 4 + 3 * i) for i in range(6)]

    async def main():
        b = backend(TINYLM)
        await b.start()
        route = b.route
        together = await asyncio.gather(*(route.generate(p, {"max_tokens": n})
                                          for p, n in prompts))
        alone = [await route.generate(p, {"max_tokens": n}) for p, n in prompts]
        events = [e async for e in route.generate_stream("hello", {"max_tokens": 3})]
        return together, alone, events, await b.stats()

    together, alone, events, stats = run(main())
    assert [t["text_output"] for t in together] == [a["text_output"] for a in alone]
    assert [t["num_tokens"] for t in together] == [n for _, n in prompts]
    assert [e["index"] for e in events[:-1]] == [0, 1, 2]
    assert events[-1]["final"] and events[-1]["num_tokens"] == 3
    assert (stats["kind"], stats["placement"], stats["open_requests"]) == (
        "iterative", "ingress", 0)


def test_closing_a_stream_early_frees_its_slot_at_the_next_step():
    async def main():
        b = backend(TINYLM)
        await b.start()
        host = b.engine.host
        events = b.route.generate_stream("hello", {"max_tokens": 500})
        seen = [await events.__anext__() for _ in range(3)]
        await events.aclose()  # the client hung up
        await spin()
        return seen, host.stats()

    seen, stats = run(main())
    assert len(seen) == 3
    assert (stats["active"], stats["cancelled"], stats["open_requests"]) == (0, 1, 0)
    assert stats["step_tokens"] < 100


def test_refusals_and_deadlines_end_their_own_stream_with_their_error():
    async def main():
        b = backend(TINYLM, batching={**TINYLM["batching"], "max_active": 1,
                                      "max_queue_size": 1})
        await b.start()
        route = b.route
        running = route.generate_stream("a", {"max_tokens": 400})
        await running.__anext__()  # holds the only slot
        waiting = asyncio.ensure_future(route.generate("b", {"max_tokens": 2}))
        await spin(5)
        with pytest.raises(QueueFull):
            await route.generate("c", {"max_tokens": 2})
        with pytest.raises(InvalidRequest, match="max_tokens"):
            await route.generate("d", {"max_tokens": "many"})
        await running.aclose()
        done = await waiting
        with pytest.raises(DeadlineExceeded):  # its join deadline passed before a step
            await route.generate("e", {"max_tokens": 2, "timeout_s": 1e-9})
        return done

    assert run(main())["num_tokens"] == 2


def test_drain_finishes_accepted_generations_then_refuses_new_ones():
    async def main():
        b = backend(TINYLM)
        await b.start()
        accepted = asyncio.ensure_future(b.route.generate("hello", {"max_tokens": 8}))
        await spin(5)
        await b.drain(timeout_s=30)
        with pytest.raises(ServiceClosed):
            await b.route.generate("late", {"max_tokens": 2})
        return await accepted

    out = run(main())
    assert (out["num_tokens"], out["finish_reason"]) == (8, "length")


def test_stream_collects_to_what_generate_answers():
    async def main():
        b = backend(TINYLM)
        streamed = await collect(b.route.generate_stream("Once", {"max_tokens": 6}))
        return streamed, await b.route.generate("Once", {"max_tokens": 6})

    streamed, whole = run(main())
    assert streamed == whole


# -- whose work the start is ---------------------------------------------------------------
def test_the_engine_started_by_a_first_request_runs_in_no_requests_context():
    """The first request starts the engine (the replica pool and its replicas). That start
    is shared by every request after it, so it must not run in the first one's context:
    in a Ray actor the context names the request, its Ray calls would be the request's
    children, and Serve cancelling that request (its client hung up) would cancel them."""
    request = contextvars.ContextVar("request", default=None)
    seen = []

    class Probe(InProcessPool):
        async def start(self) -> None:
            seen.append(request.get())
            await super().start()

    async def main():
        config = ModelConfig.model_validate(ACCUMULATOR)
        b = IngressPlacement(config, None, 1, make_pool=Probe)

        async def first():  # a stats call that finds the engine not started yet
            request.set("first")
            await b.engine.stats()
            return await b.route.infer(x(5), {"sequence_id": 7, "sequence_start": True})

        out = await asyncio.ensure_future(first())
        return int(out["OUTPUT0"][0, 0])

    assert run(main()) == 5
    assert seen == [None]
