"""SequenceHost against in-process replicas that run a real StateStore over the demo models.

No Ray and no real time: a `StoreReplica` either answers each batch after a few
loop turns (`auto`) or parks it until the test ends it; the clock is a number
the test moves, and `host.wake()` stands in for the timer.
"""

from __future__ import annotations

import asyncio
import random

import numpy as np
import pytest

from batching import (
    Cancelled,
    InvalidRequest,
    QueueFull,
    SequenceLost,
    ServiceClosed,
    UnknownSequence,
)
from batching.loop import ReplicaDied
from batching.sequence.batcher import SequenceRequest
from batching.sequence.host import SequenceHost
from batching.sequence.policy import SequencePolicy
from batching.sequence.stateful import SequenceBatchInput, StatefulTransformer, StateStore
from deployments.models.stateful import GRU, Accumulator
from tests.conftest import arun as run


class StoreReplica:
    """A SequenceReplicaClient holding a real StateStore, answered by the test or by itself."""

    def __init__(self, name: str, model: StatefulTransformer, *, auto: bool = False,
                 rng: random.Random | None = None, max_live: int | None = None) -> None:
        self.name = name
        self.store = StateStore(model)
        self.auto, self.rng, self.max_live = auto, rng, max_live
        self.batches: list[SequenceBatchInput] = []
        self.parked: list[tuple[SequenceBatchInput, asyncio.Future]] = []
        self.released: list = []
        self.log: list[tuple] = []  # ("run", sequence ids) and ("release", ids), in order
        self.dead = False

    async def run(self, batch: SequenceBatchInput):
        self.batches.append(batch)
        self.log.append(("run", batch.sequence_ids))
        if not self.auto:
            fut = asyncio.get_running_loop().create_future()
            self.parked.append((batch, fut))
            return await fut
        for _ in range(self.rng.randrange(4) if self.rng else 1):
            await asyncio.sleep(0)
        if self.dead:
            raise ReplicaDied(f"{self.name} is gone")
        return self._compute(batch)

    async def release(self, sequence_ids: list) -> None:
        self.log.append(("release", list(sequence_ids)))
        self.released.extend(sequence_ids)
        self.store.release(sequence_ids)

    def _compute(self, batch: SequenceBatchInput):
        out = self.store.run(batch)
        assert self.max_live is None or self.store.live <= self.max_live
        return out, 0.001

    def finish(self) -> SequenceBatchInput:
        """Run the oldest parked batch on the store and answer it."""
        batch, fut = self.parked.pop(0)
        fut.set_result(self._compute(batch))
        return batch

    def fail(self, error: BaseException) -> None:
        self.parked.pop(0)[1].set_exception(error)

    def die(self) -> None:
        self.dead = True
        self.store = StateStore(self.store.model)  # a restart would come back empty
        for _, fut in self.parked:
            fut.set_exception(ReplicaDied(f"{self.name} is gone"))
        self.parked.clear()


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


async def spin(turns: int = 20) -> None:
    for _ in range(turns):
        await asyncio.sleep(0)


def accumulator() -> Accumulator:
    return Accumulator()


def gru() -> GRU:
    model = GRU()
    model.setup("cpu")
    return model


def x32(v: int) -> np.ndarray:
    return np.array([v], dtype=np.int32)


def make_host(*replicas, clock=None, max_inflight=2, **policy):
    died: list[str] = []
    host = SequenceHost(SequencePolicy(**policy), max_inflight=max_inflight,
                        clock=clock or Clock(), on_replica_died=lambda c: died.append(c.name))
    for rep in replicas:
        host.add_replica(rep)
    return host, died


def submit(host, rid, sid, v, *, start=False, end=False, timeout_s=None):
    return host.submit(SequenceRequest(rid, sid, x32(v), start, end, timeout_s))


# -- many concurrent sequences get exactly what they would alone ---------------------------
def alone(model: StatefulTransformer, sid, inputs: list) -> list:
    """The outputs of one sequence run by itself, one request per batch."""
    store = StateStore(model)
    return [store.run(SequenceBatchInput(x[None], (sid,), (i == 0,), (i == len(inputs) - 1,),
                                         (True,)))[0] for i, x in enumerate(inputs)]


async def client(host, rng: random.Random, sid, inputs: list) -> list:
    outs = []
    for i, x in enumerate(inputs):
        for _ in range(rng.randrange(3)):
            await asyncio.sleep(0)
        outs.append(await host.submit(SequenceRequest(
            f"{sid}/{i}", sid, x, start=i == 0, end=i == len(inputs) - 1)))
    return outs


@pytest.mark.parametrize("model_name", ["accumulator", "gru"])
@pytest.mark.parametrize("policy", [
    {"strategy": "direct", "max_batch_size": 8},
    {"strategy": "oldest", "max_batch_size": 4, "max_candidate_sequences": 8,
     "preferred_batch_sizes": (2, 4)},
])
def test_fifty_interleaved_sequences_each_get_what_they_would_get_alone(model_name, policy):
    make_model = {"accumulator": accumulator, "gru": gru}[model_name]
    rng = random.Random(1234)
    sids = [i + 1 if i % 2 else f"seq-{i}" for i in range(50)]  # int and str ids
    if model_name == "gru":
        inputs = {s: [np.array([rng.gauss(0, 1) for _ in range(8)], np.float32)
                      for _ in range(rng.randint(1, 8))] for s in sids}
    else:
        inputs = {s: [x32(rng.randint(-100, 100)) for _ in range(rng.randint(1, 8))]
                  for s in sids}
    slots = SequencePolicy(**policy).sequences_per_replica

    async def main():
        reps = [StoreReplica(n, make_model(), auto=True, rng=rng, max_live=slots)
                for n in ("a", "b")]
        host, _ = make_host(*reps, **policy)
        outs = await asyncio.gather(*(client(host, rng, s, inputs[s]) for s in sids))
        assert all(r.store.live == 0 for r in reps)  # every sequence ended on its replica
        assert all(len(r.batches) > 0 for r in reps)
        s = host.stats()
        assert (s["live_sequences"], s["queued_requests"], s["open_requests"]) == (0, 0, 0)
        assert s["mean_batch_size"] > 1.5  # they really were batched together
        return outs

    outs = run(main())
    reference = make_model()
    for s, got in zip(sids, outs):
        want = alone(reference, s, inputs[s])
        np.testing.assert_allclose(np.stack(got), np.stack(want), rtol=0, atol=1e-5,
                                   err_msg=f"sequence {s!r}")


def test_a_cancel_between_forming_a_batch_and_sending_it_spares_its_batch_mates():
    async def main():
        a = StoreReplica("a", Accumulator())
        host, _ = make_host(a, max_batch_size=4)
        futs = {sid: submit(host, f"r{sid}", sid, 10 * sid, start=True) for sid in (1, 2, 3)}
        await asyncio.sleep(0)  # the pump formed the batch; its task has not started yet
        host.cancel("r2")
        await spin()
        assert a.finish().sequence_ids == (1, 2, 3)  # sent as formed
        await spin()
        assert futs[1].result().tolist() == [10] and futs[3].result().tolist() == [30]
        with pytest.raises(Cancelled):
            futs[2].result()
        s = host.stats()  # the cancel is one of "fail" (Triton's count), and said so
        assert (s["open_requests"], s["fail"]["count"], s["cancelled"]) == (0, 1, 1)
    run(main())


# -- idle timeout, cancellation --------------------------------------------------------------
def test_an_idle_sequence_is_released_on_its_replica_and_a_waiting_start_gets_the_slot():
    async def main():
        clock, a = Clock(), StoreReplica("a", Accumulator())
        host, _ = make_host(a, clock=clock, max_batch_size=1, max_sequence_idle_s=1.0)
        f1 = submit(host, "s1", 1, 5, start=True)
        await spin()
        a.finish()
        await spin()
        assert f1.result().tolist() == [5] and a.store.live == 1
        f2 = submit(host, "s2", 2, 7, start=True)
        await spin()
        assert a.parked == [] and host.stats()["pending_sequences"] == 1
        clock.now = 1.0
        host.wake()
        await spin()
        assert a.released == [1] and 1 not in a.store
        assert a.log[-2:] == [("release", [1]), ("run", (2,))]  # the state goes first
        assert a.finish().start == (True,)
        await spin()
        assert f2.result().tolist() == [7]
        with pytest.raises(UnknownSequence, match=r"freed after 1\.0 s idle"):
            submit(host, "late", 1, 1)
        s = host.stats()
        assert (s["releases_sent"], s["sequences_idle_freed"], s["live_sequences"]) == (1, 1, 1)
    run(main())


def test_cancelling_a_waiting_start_frees_its_place_and_a_queued_end_releases_the_state():
    async def main():
        a = StoreReplica("a", Accumulator())
        host, _ = make_host(a, max_batch_size=1, max_pending_sequences=1)
        f1 = submit(host, "s1", 1, 5, start=True)
        f2 = submit(host, "s2", 2, 1, start=True)
        with pytest.raises(QueueFull):
            submit(host, "s3", 3, 1, start=True)
        host.cancel("s2")
        with pytest.raises(Cancelled, match="'s2' cancelled by its caller"):
            f2.result()
        f3 = submit(host, "s3", 3, 1, start=True)  # s2's place in the line is free again
        await spin()
        a.finish()
        await spin()
        fe = submit(host, "e1", 1, 2, end=True)
        host.cancel("e1")
        await spin()
        assert f1.result().tolist() == [5]
        with pytest.raises(Cancelled):
            fe.result()
        assert a.released == [1] and a.store.live == 0
        a.finish()
        await spin()
        assert f3.result().tolist() == [1]
    run(main())


# -- bad controls -----------------------------------------------------------------------------
def test_bad_controls_raise_at_submit_and_the_rest_of_the_batch_runs_untouched():
    async def main():
        a = StoreReplica("a", Accumulator())
        host, _ = make_host(a, max_batch_size=4)
        first = submit(host, "s1", 1, 10, start=True)
        await spin()
        a.finish()
        await spin()
        assert first.result().tolist() == [10]
        good = [submit(host, "g1", 1, 5), submit(host, "g2", "b", 3, start=True),
                submit(host, "g3", 3, 4, start=True, end=True)]
        bad = [
            (lambda: submit(host, "x1", 99, 1), UnknownSequence),
            (lambda: submit(host, "x2", 1, 1, start=True), UnknownSequence),
            (lambda: submit(host, "x3", 3, 1), UnknownSequence),  # its end is queued
            (lambda: submit(host, "x4", 0, 1, start=True), InvalidRequest),
            (lambda: submit(host, "x5", "", 1, start=True), InvalidRequest),
            (lambda: submit(host, "g1", 1, 1), InvalidRequest),  # the id is still open
        ]
        for call, error in bad:
            with pytest.raises(error):
                call()
        await spin()
        batch = a.finish()  # the three good rows, one batch, as if nothing else was sent
        assert (batch.sequence_ids, batch.start, batch.end) == (
            (1, "b", 3), (False, True, True), (False, False, True))
        await spin()
        assert [f.result().tolist() for f in good] == [[15], [3], [4]]
        assert host.stats()["open_requests"] == 0 and a.store.live == 2
    run(main())


# -- replica death, model errors, restarts ---------------------------------------------------
def test_a_dead_replicas_sequences_are_lost_and_new_sequences_go_to_the_live_one():
    async def main():
        a, b, c = (StoreReplica(n, Accumulator()) for n in "abc")
        host, died = make_host(a, b, max_batch_size=2)
        f = {sid: submit(host, f"s{sid}", sid, sid, start=True) for sid in (1, 2, 3, 4)}
        await spin()
        a.finish()  # 1 and 3 live on a
        b.finish()  # 2 and 4 on b
        await spin()
        running = submit(host, "r1", 1, 1)
        await spin()
        queued = submit(host, "q1", 1, 1)  # waits behind r1
        on_b = submit(host, "b2", 2, 1)
        await spin()
        a.die()
        await spin()
        assert died == ["a"] and host.replicas == [b]
        for fut in (running, queued):
            with pytest.raises(SequenceLost, match="died"):
                fut.result()
        with pytest.raises(SequenceLost, match="sequence 3 was lost"):
            submit(host, "late", 3, 1)
        b.finish()
        await spin()
        assert on_b.result().tolist() == [3] and f[2].result().tolist() == [2]
        host.add_replica(c)
        again = submit(host, "again", 1, 7, start=True)  # a lost id starts afresh
        await spin()
        assert c.parked and not b.parked  # b's 2 slots are taken by 2 and 4
        c.finish()
        await spin()
        assert again.result().tolist() == [7]
        s = host.stats()
        assert (s["replica_deaths"], s["sequences_lost"], s["live_sequences"]) == (1, 2, 3)
    run(main())


def test_a_model_error_fails_only_its_batch_and_the_state_does_not_advance():
    async def main():
        a = StoreReplica("a", Accumulator())
        host, died = make_host(a, max_batch_size=2)
        f = submit(host, "s", 1, 5, start=True)
        await spin()
        a.finish()
        await spin()
        bad = submit(host, "bad", 1, 100)
        await spin()
        a.fail(ValueError("boom in the model"))
        await spin()
        with pytest.raises(ValueError, match="boom"):
            bad.result()
        good = submit(host, "good", 1, 1)
        await spin()
        a.finish()
        await spin()
        assert f.result().tolist() == [5] and good.result().tolist() == [6]
        assert died == [] and host.replicas == [a]
    run(main())


def test_a_replica_that_lost_the_state_answers_sequence_lost_and_the_sequence_ends():
    async def main():
        a = StoreReplica("a", Accumulator())
        host, _ = make_host(a, max_batch_size=2)
        submit(host, "s", 1, 5, start=True)
        await spin()
        a.finish()
        await spin()
        a.store = StateStore(a.store.model)  # restarted behind the host's back
        f = submit(host, "t", 1, 1)
        await spin()
        a.finish()
        await spin()
        with pytest.raises(SequenceLost, match="no state on this replica"):
            f.result()
        with pytest.raises(SequenceLost, match="start it again"):
            submit(host, "u", 1, 1)
        assert host.stats()["live_sequences"] == 0
    run(main())


def test_close_runs_what_is_queued_then_refuses_and_fails_the_rest():
    async def main():
        a = StoreReplica("a", Accumulator())
        host, _ = make_host(a, strategy="oldest", max_batch_size=4, max_queue_delay_s=60.0)
        f = submit(host, "s", 1, 5, start=True)
        await spin()
        assert a.parked == []  # waiting for a fuller batch
        closing = asyncio.ensure_future(host.close(timeout_s=60.0))
        await spin()
        with pytest.raises(ServiceClosed):
            submit(host, "late", 2, 1, start=True)
        a.finish()
        await spin()
        assert f.result().tolist() == [5] and closing.done()
        assert host.stats()["by_reason"] == {"drain": 1}
    run(main())


def test_a_request_timeout_fails_it_before_it_runs():
    async def main():
        clock, a = Clock(), StoreReplica("a", Accumulator())
        host, _ = make_host(a, clock=clock, max_batch_size=1, max_inflight=1)
        submit(host, "s1", 1, 5, start=True)
        late = submit(host, "s2", 2, 1, start=True, timeout_s=0.5)
        await spin()
        clock.now = 0.5
        host.wake()
        with pytest.raises(Exception, match="passed its timeout") as e:
            late.result()
        assert e.value.http_status == 504
    run(main())
