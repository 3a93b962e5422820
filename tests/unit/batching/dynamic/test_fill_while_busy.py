"""`fill_while_busy`: while every replica runs a batch, the next one keeps filling past
the delay until the first running batch is predicted to end (less `busy_lead_s`)."""

from __future__ import annotations

import asyncio

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from batching import DynamicBatcher, DynamicPolicy, FlushReason, LatencyModel
from tests.unit.batching.dynamic.test_host import Clock, FakeReplica, make_host, spin, submit

DELAY, RUN, LEAD = 0.002, 0.005, 0.001  # the delay, a batch's predicted run, the lead


def busy_batcher(warm_up: bool = True, **kw) -> tuple[DynamicBatcher, object]:
    """A batcher whose latency model predicts RUN for any batch, with one full batch of
    4 sent at t=0 (running)."""
    latency = LatencyModel(min_samples=1)
    if warm_up:
        latency.observe(1, RUN)
    q = DynamicBatcher(DynamicPolicy(max_batch_size=4, max_queue_delay_s=DELAY,
                                     busy_lead_s=LEAD, **kw), latency=latency)
    for i in range(4):
        q.submit(_req(("run", i)), now=0.0)
    running = q.next_batch(now=0.0, free_replicas=2, idle_replicas=1)
    assert running.reason == FlushReason.FULL
    return q, running


def _req(rid):
    from batching import Request

    return Request(rid, (0,), single=True)


def test_with_every_replica_busy_the_batch_fills_until_the_running_one_is_near_its_end():
    q, _ = busy_batcher(fill_while_busy=True)
    q.submit(_req("a"), now=0.0005)
    assert q.next_batch(now=0.003, free_replicas=1, idle_replicas=0) is None  # delay is over
    assert q.deadline() == pytest.approx(RUN - LEAD)  # the host's timer: when to look again
    q.submit(_req("b"), now=0.0035)
    batch = q.next_batch(now=RUN - LEAD, free_replicas=1, idle_replicas=0)
    assert (batch.ids, batch.reason) == (["a", "b"], FlushReason.DELAY)


def test_off_the_delay_alone_decides_as_before():
    q, _ = busy_batcher()
    q.submit(_req("a"), now=0.0005)
    assert q.deadline() == pytest.approx(0.0005 + DELAY)
    batch = q.next_batch(now=0.0025, free_replicas=1, idle_replicas=0)
    assert (batch.ids, batch.reason) == (["a"], FlushReason.DELAY)


@pytest.mark.parametrize("idle_replicas", [1, None], ids=["a replica is idle", "not known"])
def test_an_idle_replica_or_an_unknown_count_gets_the_batch_after_the_delay(idle_replicas):
    q, _ = busy_batcher(fill_while_busy=True)
    q.submit(_req("a"), now=0.0005)
    batch = q.next_batch(now=0.0025, free_replicas=1, idle_replicas=idle_replicas)
    assert (batch.ids, batch.reason) == (["a"], FlushReason.DELAY)


def test_a_cold_latency_model_holds_nothing():
    q, _ = busy_batcher(warm_up=False, fill_while_busy=True)
    q.submit(_req("a"), now=0.0005)
    assert q.next_batch(now=0.0025, free_replicas=1, idle_replicas=0).ids == ["a"]


def test_a_full_batch_is_not_held():
    q, _ = busy_batcher(fill_while_busy=True)
    for rid in "abcd":
        q.submit(_req(rid), now=0.0005)
    batch = q.next_batch(now=0.0005, free_replicas=1, idle_replicas=0)
    assert (batch.ids, batch.reason) == (list("abcd"), FlushReason.FULL)


def test_a_deadline_is_not_held_past():
    q, _ = busy_batcher(fill_while_busy=True)
    from batching import Request

    q.submit(Request("urgent", (0,), single=True, timeout_s=0.008), now=0.0005)
    assert q.next_batch(now=0.0005, free_replicas=1, idle_replicas=0) is None
    # due when its deadline (0.0085) leaves just the predicted run (0.005): 0.0035
    assert q.deadline() == pytest.approx(0.0035)
    batch = q.next_batch(now=q.deadline(), free_replicas=1, idle_replicas=0)
    assert (batch.ids, batch.reason) == (["urgent"], FlushReason.DEADLINE)


def test_a_batch_that_overran_its_prediction_holds_nothing_more():
    q, _ = busy_batcher(fill_while_busy=True)
    q.submit(_req("a"), now=0.007)  # the running batch was due to end at 0.005
    assert q.next_batch(now=0.0095, free_replicas=1, idle_replicas=0).ids == ["a"]


def test_the_host_counts_a_replica_running_a_batch_as_busy_and_holds_for_it():
    """Through `BatchHost`: one replica, two pipeline slots; the second batch waits
    past the delay for the first to near its end, and is sent fuller."""

    async def main(fill: bool) -> list[list]:
        clock = Clock()
        a = FakeReplica("a")
        host, _ = make_host(a, max_batch_size=4, max_inflight=2, clock=clock,
                            max_queue_delay_s=DELAY, fill_while_busy=fill, busy_lead_s=LEAD)
        for _ in range(8):
            host.engine.latency.observe(4, RUN)
        futs = [submit(host, i, i) for i in range(4)]  # full: sent, running on a
        await spin()
        clock.now = 0.0005
        futs.append(submit(host, 4, 4))
        await spin()
        clock.now = 0.003  # past the delay: a submit makes the host look again
        futs.append(submit(host, 5, 5))
        await spin()
        clock.now = RUN - LEAD
        futs.append(submit(host, 6, 6))
        await spin()
        closing = asyncio.ensure_future(host.close(timeout_s=5))  # sends what is left
        while not closing.done():
            await spin()
            if a.pending():
                a.finish()
        sent = [items for items, _ in a.calls]
        assert [f.result() for f in futs] == [f"a:{i * i}" for i in range(len(futs))]
        return sent

    assert asyncio.run(main(fill=False)) == [[0, 1, 2, 3], [4, 5], [6]]
    assert asyncio.run(main(fill=True)) == [[0, 1, 2, 3], [4, 5, 6]]


def test_a_batch_sent_into_a_pipeline_slot_is_predicted_to_end_after_the_one_it_waits_for():
    """Steady state on one replica: the held batch goes to the replica's second slot at
    0.004, starts when the running one ends (0.005) and ends at 0.010; the batch after it
    is held until then, not until 0.004 + RUN (as if it had started when sent)."""
    q, running = busy_batcher(fill_while_busy=True)
    q.submit(_req("a"), now=0.001)
    pipelined = q.next_batch(now=RUN - LEAD, free_replicas=1, idle_replicas=0)
    assert pipelined.ids == ["a"]
    q.complete(running.id, now=RUN, compute_s=RUN)  # "a" starts running now
    q.submit(_req("b"), now=0.006)
    assert q.next_batch(now=0.0085, free_replicas=1, idle_replicas=0) is None
    assert q.deadline() == pytest.approx(2 * RUN - LEAD)
    assert q.next_batch(now=2 * RUN - LEAD, free_replicas=1, idle_replicas=0).ids == ["b"]


@settings(max_examples=300, deadline=None)
@given(ops=st.lists(st.tuples(st.sampled_from(["submit", "submit", "submit", "tick", "complete"]),
                              st.sampled_from([0.0, 0.0, 0.0005, 0.001, 0.002, 0.004])),
                    max_size=80),
       replicas=st.integers(1, 3), lead=st.sampled_from([0.0, 0.001, 0.003]))
def test_a_replica_never_idles_with_a_due_batch_and_every_request_ends(ops, replicas, lead):
    """Random arrivals and completions on 1-3 replicas with two slots each: whenever a
    replica is idle, nothing due is held (the oldest request waited the delay: sent);
    nothing is held forever (every request ends); each ends once."""
    latency = LatencyModel(min_samples=1)
    latency.observe(1, RUN)
    q = DynamicBatcher(DynamicPolicy(max_batch_size=4, max_queue_delay_s=DELAY,
                                     idle_dispatch=True, fill_while_busy=True,
                                     busy_lead_s=lead), latency=latency)
    slots: list[list] = [[] for _ in range(replicas)]  # each replica's batches; [0] runs
    arrived: dict[int, float] = {}  # request id -> arrival, while queued
    ended: list = []
    now = 0.0
    held = 0

    def pump() -> None:
        nonlocal held
        while True:
            free = sum(2 - len(s) for s in slots)
            idle = sum(not s for s in slots)
            batch = q.next_batch(now=now, free_replicas=free, idle_replicas=idle)
            if batch is None:
                break
            for rid in batch.ids:
                del arrived[rid]
            min(slots, key=len).append(batch)
        if arrived and any(not s for s in slots):  # an idle replica: nothing due is held
            assert min(arrived.values()) + DELAY > now, (arrived, now)
        held += bool(free and arrived and q._hold_until_s > now)

    def complete_one() -> None:
        busy = [s for s in slots if s]
        batch = busy[0].pop(0)
        q.complete(batch.id, now=now, compute_s=RUN)
        ended.extend(batch.ids)

    n = 0
    for op, dt in ops:
        now += dt
        if op == "submit":
            q.submit(_req(n), now=now)
            arrived[n] = now
            n += 1
        elif op == "complete" and any(slots):
            complete_one()
        pump()
    for _ in range(4 * n + 10):  # drain: run what is in flight, wake when the engine asks
        if any(slots):
            now += RUN / 2
            complete_one()
        elif arrived:
            now = max(now, q.deadline())
        else:
            break
        pump()
    assert sorted(ended) == list(range(n))  # every request ended, once
    event(f"held {min(held, 3)}+ times")
