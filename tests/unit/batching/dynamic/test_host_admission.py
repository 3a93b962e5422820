"""Deadline admission through `BatchHost`: an open-loop overload at 10x capacity driven on a
fake clock, concurrent submits, a replica the test finishes by hand; every request checked."""

from __future__ import annotations

import asyncio

import pytest

from batching import DeadlineExceeded, Overloaded, QueueFull, QueuePolicy
from batching.types import Request
from tests.conftest import arun as run
from tests.unit.batching.dynamic.test_host import Clock, FakeReplica, make_host, spin

RATE_PER_S, BATCH, BATCH_S, TIMEOUT_S, SECONDS = 80, 4, 0.5, 2.0, 6


async def overload(admission: bool) -> tuple[list[float], dict[str, int]]:
    """A request every 1/80 s for 6 s (10x the replica's 4 per 0.5 s, two batches in
    flight at most), then until all ended: the accepted requests' latencies and how
    many ended (or were refused) with each error."""
    clock, replica = Clock(), FakeReplica("r")
    host, _ = make_host(replica, max_batch_size=BATCH, clock=clock,
                        deadline_admission=admission,
                        default_queue_policy=QueuePolicy(max_queue_size=8 * BATCH))
    sent: dict[int, tuple[float, asyncio.Future]] = {}
    ended: dict[int, float] = {}
    errors: dict[str, int] = {}
    steps_per_batch = int(BATCH_S * RATE_PER_S)
    step = 0
    while step < SECONDS * RATE_PER_S or host.open_requests:
        clock.now = step / RATE_PER_S
        if step < SECONDS * RATE_PER_S:
            try:
                fut = host.submit(Request(step, (step,), single=True, timeout_s=TIMEOUT_S))
                sent[step] = clock.now, fut
                fut.add_done_callback(lambda f, k=step: ended.setdefault(k, clock.now))
            except QueueFull as e:  # Overloaded is a QueueFull
                errors[type(e).__name__] = errors.get(type(e).__name__, 0) + 1
        if step % steps_per_batch == steps_per_batch - 1 and replica.pending():
            replica.finish(compute_s=BATCH_S)  # the oldest batch ran the last 0.5 s
        await spin()
        step += 1
    latencies = []
    for k, (t, fut) in sent.items():
        assert fut.done(), f"request {k} never ended"
        if fut.exception() is None:
            assert fut.result() == f"r:{k * k}", (k, fut.result())  # its own answer
            latencies.append(ended[k] - t)
        else:
            name = type(fut.exception()).__name__
            errors[name] = errors.get(name, 0) + 1
    return latencies, errors


def test_at_ten_times_capacity_every_accepted_request_ends_within_its_timeout():
    latencies, errors = run(overload(admission=True))
    assert max(latencies) <= TIMEOUT_S, sorted(latencies)[-5:]
    assert set(errors) <= {"Overloaded", "QueueFull"}, errors  # refused or shed: no 504
    # the replica was kept busy: at least 80% of its 8/s
    assert len(latencies) >= 0.8 * SECONDS * BATCH / BATCH_S, (len(latencies), errors)


def test_without_admission_accepted_requests_wait_out_their_timeout():
    latencies, errors = run(overload(admission=False))
    assert errors.get(DeadlineExceeded.__name__, 0) > 0.5 * len(latencies), errors


def test_overloaded_is_a_queue_full():
    assert issubclass(Overloaded, QueueFull) and Overloaded("x").retry_after_s is None
    with pytest.raises(QueueFull):
        raise Overloaded("x", retry_after_s=1.0)
