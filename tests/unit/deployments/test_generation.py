"""Generation streams multiplexed between a caller (`GenerateMux`) and a batching actor's
`StreamHub`, without Ray: the fake actor's `.remote` calls the hub directly.

The model is the real TinyLM behind a real `IterativeHost`, so what the mux
delivers can be compared token for token with what the host produced.
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time

import pytest

from batching.errors import InvalidRequest, Overloaded, QueueFull
from batching.iterative.generative import Generator
from batching.iterative.host import IterativeHost, LocalStepClient
from batching.iterative.policy import IterativePolicy
from deployments.models.tinylm import TinyLM
from deployments.wire.generation import GenerateMux, StreamHub, collect, generate_request
from tests.conftest import arun as run
from tests.conftest import until


class _Method:
    def __init__(self, fn, counter):
        self.fn, self.counter = fn, counter

    def remote(self, *args):
        self.counter[self.fn.__name__] = self.counter.get(self.fn.__name__, 0) + 1
        result = self.fn(*args)
        if asyncio.iscoroutine(result):
            return result
        fut = asyncio.get_running_loop().create_future()
        fut.set_result(result)
        return fut


class FakeActor:
    """The three methods BatcherActor exposes for generations, over a StreamHub."""

    def __init__(self, hub: StreamHub) -> None:
        self.calls: dict[str, int] = {}
        self.started: list[tuple] = []  # every entry sent to start_generations
        self.hub_start = hub.start  # the hub's start, called as the actor would

        def start_generations(caller, entries, sent=None):
            self.started.extend(entries)
            return hub.start(caller, entries, sent)

        async def poll_generations(caller):
            return await hub.poll(caller, wait_s=1.0)

        def cancel_generations(caller, keys):
            hub.cancel(caller, keys)

        for fn in (start_generations, poll_generations, cancel_generations):
            setattr(self, fn.__name__, _Method(fn, self.calls))


async def _setup(**policy):
    host = IterativeHost(IterativePolicy(**policy))
    model = TinyLM()
    model.setup("cpu")
    client = LocalStepClient(Generator(model), thread=False)
    host.add_replica(client)
    ids = itertools.count()
    hub = StreamHub(host, lambda: next(ids))
    actor = FakeActor(hub)
    return host, actor, GenerateMux(lambda: actor)


def test_concurrent_streams_get_their_own_text_with_one_poll_per_step_not_per_stream():
    prompts = [("abc" * (i + 1), 5 + 3 * i) for i in range(8)]

    async def main():
        _host, actor, mux = await _setup(max_active=8)
        together = await asyncio.gather(*(collect(mux.stream(p, {"max_tokens": n}))
                                          for p, n in prompts))
        alone = [await collect(mux.stream(p, {"max_tokens": n})) for p, n in prompts]
        return together, alone, actor.calls

    together, alone, calls = run(main())
    assert [t["text_output"] for t in together] == [a["text_output"] for a in alone]
    assert [t["num_tokens"] for t in together] == [n for _, n in prompts]
    # the 8 concurrent generations were started in one call, and polled far less than
    # once per token per stream
    assert calls["start_generations"] == 1 + len(prompts)
    assert calls["poll_generations"] < sum(n for _, n in prompts)


def test_closing_a_stream_early_cancels_its_generation():
    async def main():
        host, _actor, mux = await _setup(max_active=4)
        events = mux.stream("hello", {"max_tokens": 500})
        seen = [await events.__anext__() for _ in range(3)]
        await events.aclose()
        await until(lambda: host.stats()["active"] == 0 and host.stats()["cancelled"] == 1,
                    "the generation cancelled", 30)
        return seen, host.stats()

    seen, stats = run(main())
    assert len(seen) == 3 and stats["active"] == 0 and stats["cancelled"] == 1
    assert stats["step_tokens"] < 100


def test_refused_generations_raise_their_error_to_that_stream_only():
    async def main():
        _host, _actor, mux = await _setup(max_active=1, max_queue_size=2)
        first = asyncio.ensure_future(collect(mux.stream("a", {"max_tokens": 40})))
        waiting = asyncio.ensure_future(collect(mux.stream("b", {"max_tokens": 3})))
        refused = asyncio.ensure_future(collect(mux.stream("c", {"max_tokens": 3})))
        return await asyncio.gather(first, waiting, refused, return_exceptions=True)

    first, waiting, refused = run(main())
    assert first["num_tokens"] == 40 and waiting["num_tokens"] == 3
    assert isinstance(refused, QueueFull)


def test_bad_parameters_fail_before_any_call():
    async def main():
        _host, actor, mux = await _setup()
        with pytest.raises(InvalidRequest, match="temperature"):
            await collect(mux.stream("a", {"temperature": 2.5}))
        return actor.calls

    assert run(main()) == {}


@pytest.mark.parametrize("params, words", [
    ({"max_tokens": "3"}, "max_tokens"), ({"stop": ""}, "stop"), ({"stop": [1]}, "stop"),
    ({"priority": -1}, "priority"), ({"timeout": 1.5}, "microseconds"),
    ({"priority": True}, "priority"), ({"timeout": True}, "microseconds"),
    ({"timeout_s": "5"}, "timeout_s"), ({"timeout_s": -1}, "timeout_s"),
    ({"timeout_s": float("nan")}, "timeout_s"), ({"timeout_s": False}, "timeout_s"),
    ({"timeout_s": 10**400}, "timeout_s"),
    ({"timeout": 10**400}, "below 2\\*\\*64"),  # a Python caller's: was an OverflowError
])
def test_generate_request_checks_each_parameter(params, words):
    with pytest.raises(InvalidRequest, match=words):
        generate_request(1, "prompt", params)


def test_generate_request_reads_timeout_in_microseconds_and_one_stop_string():
    r = generate_request(1, "p", {"timeout": 250_000, "stop": "\n", "max_tokens": 4})
    assert (r.timeout_s, r.stop, r.max_tokens) == (0.25, ("\n",), 4)


def test_a_caller_that_stops_polling_has_its_generations_cancelled():
    async def main():
        host = IterativeHost(IterativePolicy())  # no replica: the generation waits
        hub = StreamHub(host, iter(range(1000, 2000)).__next__, lease_s=0.3)
        hub.start("gone", [(0, "abc", {"max_tokens": 1000})])
        await until(lambda: host.stats()["cancelled"], "the lease run out", 30)
        return host.stats()

    assert run(main())["cancelled"] == 1


class _Failing:
    """A method whose call is an awaitable that is not a coroutine (as a Ray ObjectRef)
    and fails when awaited."""

    def __init__(self, counter):
        self.counter = counter

    def remote(self, *args):
        self.counter["cancel_generations"] = self.counter.get("cancel_generations", 0) + 1
        fut = asyncio.get_running_loop().create_future()
        fut.set_exception(RuntimeError("the batching actor is unreachable"))
        return fut


def test_a_hung_up_stream_is_cancelled_in_one_call_whose_errors_are_logged(caplog):
    async def main():
        loop_errors: list = []
        asyncio.get_running_loop().set_exception_handler(lambda _, ctx: loop_errors.append(ctx))
        host, actor, mux = await _setup(max_active=4)
        hub_cancel = actor.cancel_generations.fn

        def cancel_generations(caller, keys):  # answers with a future, as Ray's ObjectRef
            hub_cancel(caller, keys)
            fut = asyncio.get_running_loop().create_future()
            fut.set_result(None)
            return fut

        actor.cancel_generations.fn = cancel_generations
        streams = [mux.stream(p, {"max_tokens": 500}) for p in ("hello", "world")]
        for s in streams:
            await s.__anext__()
        for s in streams:
            await s.aclose()
        await until(lambda: host.stats()["cancelled"] == 2, "both cancelled", 30)
        cancelled = host.stats()["cancelled"]
        actor.cancel_generations = _Failing(actor.calls)
        third = mux.stream("again", {"max_tokens": 500})
        await third.__anext__()
        await third.aclose()
        for _ in range(5):
            await asyncio.sleep(0)
        return cancelled, actor.calls, loop_errors

    with caplog.at_level(logging.WARNING, logger="deployments.wire.generation"):
        cancelled, calls, loop_errors = run(main())
    assert loop_errors == [], loop_errors  # nothing raised in a callback or lost in a task
    assert cancelled == 2
    assert calls["cancel_generations"] == 2  # the two hang-ups of one tick: one call
    assert "cancelling 1 generations at the batching actor failed" in caplog.text
    assert "unreachable" in caplog.text


def test_a_generations_timeout_travels_as_a_deadline_and_what_is_left_is_the_hosts():
    """The mux turns the timeout into a deadline where the stream is asked for; the hub
    gives the engine what is left of it on arrival, not the whole timeout again."""
    async def main():
        host, actor, mux = await _setup(max_active=2)
        seen = []
        submit = host.submit
        host.submit = lambda request: seen.append(request) or submit(request)
        before = time.monotonic()
        out = await collect(mux.stream("abc", {"max_tokens": 2, "timeout_s": 30}))
        (_, _, _, deadline), = actor.started
        assert before + 30 <= deadline <= time.monotonic() + 30
        assert 0 < seen[0].timeout_s <= 30 and out["final"]
        # a start that reaches the hub with 60 s of its hour left: the engine gets 60 s at
        # most (a margin no stall of a busy machine between the two lines eats up)
        seen.clear()
        refused = actor.hub_start("c", [(9, "abc", {"timeout_s": 3600},
                                         time.monotonic() + 60.0)])
        assert refused == [] and 0 < seen[0].timeout_s <= 60.0
        host.cancel(seen[0].id, "done with it")

    run(main())


def test_a_generation_whose_deadline_passed_on_the_way_is_refused_and_nothing_runs():
    async def main():
        host, actor, _ = await _setup(max_active=2)
        seen = []
        host.submit = lambda request: seen.append(request)
        refused = actor.hub_start("c", [(1, "abc", {"timeout_s": 5}, time.monotonic() - 1.0),
                                        (2, "abc", {"timeout_s": 5}, "soon")])
        return refused, seen

    refused, seen = run(main())
    assert [key for key, _ in refused] == [1, 2] and seen == []
    late, garbled = refused[0][1], refused[1][1]
    assert isinstance(late, Overloaded) and "past its deadline" in str(late)
    assert isinstance(garbled, InvalidRequest) and "instant" in str(garbled)
