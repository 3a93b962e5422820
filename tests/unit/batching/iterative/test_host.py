"""IterativeHost against in-process replicas running real Generators.

`FakeStepReplica` parks every step on a future until the test runs it (through
its Generator), fails it, or kills the replica; the clock is a number the test
moves and the loop only turns with `asyncio.sleep(0)`. The last test runs
TinyLM: 32 prompts batched continuously equal each generated alone.
"""

from __future__ import annotations

import asyncio

import pytest

from batching.errors import (
    Cancelled,
    DeadlineExceeded,
    InvalidRequest,
    QueueFull,
    ServiceClosed,
    WorkerDied,
)
from batching.iterative.generative import Generator, StepModel
from batching.iterative.host import DIED, Finished, IterativeHost, LocalStepClient, TokenEvent
from batching.iterative.policy import IterativePolicy
from batching.iterative.scheduler import GenerateRequest, Join
from batching.loop import ReplicaDied
from tests.conftest import arun as run


class Spell(StepModel):
    """Continues a prompt with its letters upper-cased, one per step, then eos."""

    eos_id = 0

    def encode(self, text):
        return [ord(c) for c in text]

    def decode(self, tokens):
        return "".join(map(chr, tokens))

    def prefill(self, prompts):
        return [(self.decode(p).upper(), 0) for p in prompts]

    def step(self, states):
        tokens = [ord(s[i]) if i < len(s) else 0 for s, i in states]
        return tokens, [(s, i + 1) for s, i in states]


class FakeStepReplica:
    """A StepReplicaClient whose steps wait until the test runs, fails or kills them."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.gen = Generator(Spell())
        self.calls: list[tuple[list, list, asyncio.Future]] = []

    async def step(self, join, leave):
        fut = asyncio.get_running_loop().create_future()
        self.calls.append((join, leave, fut))
        return await fut

    def pending(self) -> list[tuple[list, list]]:
        """(joining ids, leaving ids) of each step not answered yet."""
        return [([j.id for j in join], list(leave)) for join, leave, f in self.calls
                if not f.done()]

    def _open(self):
        return next((j, lv, f) for j, lv, f in self.calls if not f.done())

    def run(self) -> None:
        join, leave, fut = self._open()
        fut.set_result((self.gen.step(join, leave), 0.001))

    def fail(self, error: BaseException) -> None:
        self._open()[2].set_exception(error)

    def die(self) -> None:
        for *_, fut in self.calls:
            if not fut.done():
                fut.set_exception(ReplicaDied(f"{self.name} is gone"))


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def spin(turns: int = 10) -> None:
    for _ in range(turns):
        await asyncio.sleep(0)


def make_host(*replicas, clock=None, **policy):
    died: list[str] = []
    host = IterativeHost(IterativePolicy(**policy), clock=clock or Clock(),
                         on_replica_died=lambda client: died.append(client.name))
    for r in replicas:
        host.add_replica(r)
    return host, died


async def drain(stream) -> list:
    return [event async for event in stream]


def test_a_stream_yields_each_steps_text_then_finished():
    async def main():
        r = FakeStepReplica("r")
        host, _ = make_host(r)
        events = asyncio.ensure_future(drain(host.submit(GenerateRequest("a", "abc"))))
        whole = asyncio.ensure_future(host.submit(GenerateRequest("b", "xy")).result())
        for _ in range(4):
            await spin()
            assert not whole.done() or r.gen.live < 2
            r.run()
        await spin()
        assert whole.result() == Finished("b", "XY", "eos", 3, 2)
        assert events.result() == [
            TokenEvent("a", 0, "A"), TokenEvent("a", 1, "B"), TokenEvent("a", 2, "C"),
            Finished("a", "ABC", "eos", 4, 3)]
        assert host.stats()["open_requests"] == 0 and r.gen.live == 0
    run(main())


def test_sequences_join_a_running_batch_at_the_next_step_and_result_collects():
    async def main():
        r = FakeStepReplica("r")
        host, _ = make_host(r, max_active=2)
        a = host.submit(GenerateRequest("a", "abcd", max_tokens=3))
        await spin()
        b, c = host.submit(GenerateRequest("b", "xy")), host.submit(GenerateRequest("c", "q"))
        assert r.pending() == [(["a"], [])]  # one step in flight per replica
        r.run()
        await spin()
        assert r.pending() == [(["b"], [])]  # b joins at the boundary; c waits (max_active)
        r.run()
        await spin()
        assert r.pending() == [([], [])]
        r.run()  # a's third token: length; b ends with "XY" next step
        await spin()
        assert r.pending() == [(["c"], [])]
        while r.pending():
            r.run()
            await spin()
        assert await a.__anext__() == TokenEvent("a", 0, "A")  # then the rest at once:
        results = [await s.result() for s in (a, b, c)]
        assert await a.result() is results[0]  # kept
        assert [(f.text, f.finish_reason) for f in results] == [
            ("ABC", "length"), ("XY", "eos"), ("Q", "eos")]
    run(main())


def test_aclose_cancels_and_frees_the_slot_at_the_next_step():
    async def main():
        r = FakeStepReplica("r")
        host, _ = make_host(r, max_active=1)
        a = host.submit(GenerateRequest("a", "abcdef"))
        b = host.submit(GenerateRequest("b", "xy"))
        await spin()
        r.run()
        assert await a.__anext__() == TokenEvent("a", 0, "A")
        await a.aclose()
        await spin()
        assert r.pending() == [(["b"], ["a"])]  # a leaves, b takes its slot, same step
        r.run()
        await spin()
        assert r.gen.live == 1 and not r.gen.holds("a")
        with pytest.raises(StopAsyncIteration):
            await a.__anext__()
        while r.pending():
            r.run()
            await spin()
        assert (await b.result()).text == "XY"
        s = host.stats()
        assert (s["cancelled"], s["completed"], s["active"], s["waiting"]) == (1, 1, 0, 0)
    run(main())


def test_cancel_fails_the_stream_and_no_token_reaches_it_afterwards():
    async def main():
        r = FakeStepReplica("r")
        host, _ = make_host(r)
        a = host.submit(GenerateRequest("a", "abc"))
        await spin()
        r.run()
        await spin()
        host.cancel("a", "because the test said so")
        r.run()  # the step in flight still answers for a: dropped
        await spin()
        assert await a.__anext__() == TokenEvent("a", 0, "A")
        with pytest.raises(Cancelled, match="'a' because the test said so"):
            await a.__anext__()
        await spin()
        assert r.pending() == [([], ["a"])]  # a leave-only step frees the replica's state
        r.run()
        assert r.gen.live == 0
        s = host.stats()  # a cancel is no failure
        assert (s["cancelled"], s["failed"], s["completed"]) == (1, 0, 0)
    run(main())


def test_a_cancel_between_forming_a_step_and_sending_it_spares_its_step_mates():
    async def main():
        r = FakeStepReplica("r")
        host, _ = make_host(r)
        streams = {k: host.submit(GenerateRequest(k, k * 2)) for k in ("a", "b", "c")}
        await asyncio.sleep(0)  # the pump formed the step; its task has not started yet
        host.cancel("b")
        await spin()
        assert r.pending() == [(["a", "b", "c"], [])]  # sent as formed; b leaves next step
        while r.pending():
            r.run()
            await spin()
        assert (await streams["a"].result()).text == "AA"
        assert (await streams["c"].result()).text == "CC"
        with pytest.raises(Cancelled):
            await streams["b"].result()
        assert host.stats()["open_requests"] == 0 and r.gen.live == 0
    run(main())


def test_a_dead_replicas_streaming_sequences_fail_and_unstarted_ones_move():
    async def main():
        r0, r1 = FakeStepReplica("r0"), FakeStepReplica("r1")
        host, died = make_host(r0, max_active=4)
        a = host.submit(GenerateRequest("a", "abc"))
        await spin()
        r0.run()  # a streams "A"; its next step leaves at once
        await spin()
        b = host.submit(GenerateRequest("b", "xy"))
        r0.run()
        await spin()
        assert r0.pending() == [(["b"], [])]
        host.add_replica(r1)
        r0.die()
        await spin()
        assert died == ["r0"] and host.replicas == [r1]
        assert [await a.__anext__() for _ in "AB"] == [TokenEvent("a", 0, "A"),
                                                      TokenEvent("a", 1, "B")]
        with pytest.raises(WorkerDied, match=DIED):
            await a.__anext__()
        assert r1.pending() == [(["b"], [])]  # b had streamed nothing: it runs again on r1
        while r1.pending():
            r1.run()
            await spin()
        assert (await b.result()).text == "XY"
        assert host.stats()["replica_deaths"] == 1 and host.stats()["requeued"] == 1
    run(main())


def test_a_model_error_fails_only_its_steps_sequences_and_keeps_the_replica():
    async def main():
        r0, r1 = FakeStepReplica("r0"), FakeStepReplica("r1")
        host, died = make_host(r0, r1, max_active=1)
        a, b = host.submit(GenerateRequest("a", "ab")), host.submit(GenerateRequest("b", "cd"))
        await spin()
        assert (r0.pending(), r1.pending()) == ([(["a"], [])], [(["b"], [])])  # concurrent
        r0.fail(ValueError("boom in the model"))
        await spin()
        with pytest.raises(ValueError, match="boom in the model"):
            await a.result()
        assert died == [] and host.replicas == [r0, r1]
        assert r0.pending() == [([], ["a"])]  # the replica is told to free a
        r0.run()
        c = host.submit(GenerateRequest("c", "e"))
        await spin()
        assert r0.pending() == [(["c"], [])]
        for r in (r0, r1, r0, r1, r1):
            if r.pending():
                r.run()
            await spin()
        assert [(await s.result()).text for s in (b, c)] == ["CD", "E"]
        s = host.stats()
        assert (s["failed"], s["cancelled"], s["completed"]) == (1, 0, 2)
    run(main())


def test_a_sequence_the_replica_fails_alone_raises_its_error_and_its_step_mates_go_on():
    async def main():  # Spell has no step_logits: it cannot sample
        r = FakeStepReplica("r")
        host, _ = make_host(r)
        a = host.submit(GenerateRequest("a", "ab"))
        s = host.submit(GenerateRequest("s", "xyz", temperature=0.8, seed=1))
        await spin()
        r.run()
        await spin()
        with pytest.raises(InvalidRequest, match=r"Spell decodes greedily only .*temperature 0"):
            await s.result()
        assert r.pending() == [([], [])]  # dropped by the replica: no leave for it
        while r.pending():
            r.run()
            await spin()
        assert (await a.result()).text == "AB"
        st = host.stats()
        assert (st["failed"], st["completed"], st["active"], r.gen.live) == (1, 1, 0, 0)
    run(main())


def test_a_request_whose_join_deadline_passes_fails_with_deadline_exceeded():
    async def main():
        clock, r = Clock(), FakeStepReplica("r")
        host, _ = make_host(r, clock=clock, max_active=1)
        a = host.submit(GenerateRequest("a", "abc"))
        await spin()
        b = host.submit(GenerateRequest("b", "xy", timeout_s=1.0))
        await spin()
        assert r.pending() == [(["a"], [])]
        clock.now = 2.0
        r.run()
        await spin()
        with pytest.raises(DeadlineExceeded, match=r"'b' waited 2000\.0 ms"):
            await b.result()
        assert r.pending() == [([], [])]  # b never joined
        assert host.stats()["expired"] == 1 and not a._ended
    run(main())


def test_submit_refuses_at_once_and_keeps_nothing():
    async def main():
        host, _ = make_host(max_queue_size=1, max_tokens_limit=8, max_tokens_default=8)
        with pytest.raises(InvalidRequest, match="empty prompt"):
            host.submit(GenerateRequest("a", ""))
        with pytest.raises(InvalidRequest, match="max_tokens=9"):
            host.submit(GenerateRequest("a", "x", max_tokens=9))
        host.submit(GenerateRequest("a", "x"))
        with pytest.raises(InvalidRequest, match="still open"):
            host.submit(GenerateRequest("a", "x"))
        with pytest.raises(QueueFull):
            host.submit(GenerateRequest("b", "x"))
        assert host.stats()["open_requests"] == 1
    run(main())


def test_prompt_tokens_come_from_count_tokens():
    async def main():
        r = FakeStepReplica("r")
        host = IterativeHost(IterativePolicy(max_step_tokens=40),
                             count_tokens=lambda t: 10 * len(t), clock=Clock())
        host.add_replica(r)
        with pytest.raises(InvalidRequest, match="50 tokens"):
            host.submit(GenerateRequest("a", "abcde"))
        s = host.submit(GenerateRequest("a", "ab"))
        for _ in range(3):
            await spin()
            r.run()
        assert (await s.result()).prompt_tokens == 20
        assert host.stats()["step_tokens"] == 20 + 1 + 1
    run(main())


def test_close_refuses_new_requests_lets_open_ones_finish_then_fails_the_rest():
    async def main():
        r = FakeStepReplica("r")
        host, _ = make_host(r, max_active=1)
        a = host.submit(GenerateRequest("a", "a"))
        b = host.submit(GenerateRequest("b", "bcdef"))
        await spin()
        closing = asyncio.ensure_future(host.close(timeout_s=60.0))
        await spin()
        with pytest.raises(ServiceClosed, match="closing"):
            host.submit(GenerateRequest("c", "x"))
        for _ in range(4):
            if r.pending():
                r.run()
            await spin()
        assert (await a.result()).text == "A" and not closing.done()
        host2, _ = make_host(FakeStepReplica("idle"))
        await host2.close(timeout_s=0)  # nothing open: returns at once
        closing.cancel()
        await host.close(timeout_s=0)
        with pytest.raises(ServiceClosed, match="drain timeout"):
            await b.result()
    run(main())


def test_continuous_batching_of_32_mixed_prompts_equals_one_at_a_time_token_for_token():
    from deployments.models.tinylm import TinyLM

    model = TinyLM()
    model.setup("cpu")
    prompts = [("The river ran slowly past the old town. " * 3)[: 1 + (i * 37) % 110]
               for i in range(32)]
    max_tokens = [1 + (i * 29) % 60 for i in range(32)]
    stops = [(" t",) if i % 5 == 0 else () for i in range(32)]

    def alone(i: int) -> str:
        gen, text = Generator(model), ""
        outs = gen.step([Join(i, prompts[i], max_tokens[i], stops[i])], [])
        while True:
            [out] = outs
            text += out.text
            if out.finished:
                return text
            outs = gen.step([], [])

    async def batched() -> tuple[list[str], dict]:
        host = IterativeHost(IterativePolicy(max_active=8, max_step_tokens=256),
                             count_tokens=TinyLM.count_tokens)
        host.add_replica(LocalStepClient(Generator(model), "r0", thread=False))
        host.add_replica(LocalStepClient(Generator(model), "r1", thread=False))
        streams = [host.submit(GenerateRequest(i, p, max_tokens[i], stops[i]))
                   for i, p in enumerate(prompts)]
        done = await asyncio.gather(*(s.result() for s in streams))
        return [f.text for f in done], host.stats()

    texts, stats = run(batched())
    assert stats["max_active_seen"] == 8 and stats["joins"] == 32
    assert stats["steps"] < sum(max_tokens) / 4  # batched, not one at a time
    assert stats["active"] == 0 and stats["finished"]["length"] > 0
    expected = [alone(i) for i in range(32)]
    assert texts == expected
    assert len(set(expected)) > 16  # the prompts lead to different texts

