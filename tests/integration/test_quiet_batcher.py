"""A batching actor that goes quiet for a while loses no request.

On a loaded node a process can get no CPU for seconds; its direct connections go silent
as a lost host's do. Here `slowsquare`'s batching actor is stopped (SIGSTOP) for
`PAUSE_S`, longer than `replicas.link_dead_s` (2 s), while 16 closed-loop callers have
requests open on their connection to it, then resumed. The callers' heartbeat takes the
silence for a possible loss, asks Ray about the actor (the coalescer's `ask_ray`, at most
5 s), and keeps the connection when it answers; the actor, resumed, finds its replicas'
answers waiting unread and does not take them for lost either. Checked: every request
gets its own x², none fails; the callers' connection was spared, not replaced; the
batching actor lost no replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal

import numpy as np
import pytest

from deployments.ingress.client import RaybatchClient
from tests.conftest import alive_pids, arun

pytestmark = pytest.mark.integration

MODEL = "slowsquare"
CALLERS = 16
PAUSE_S = 3.0  # past link_dead_s (2 s); within it and the 5 s Ray is given to answer


def x(i: int) -> dict:
    return {"INPUT0": np.array([i, i + 0.5], np.float32)}


def test_a_batching_actor_stopped_past_link_dead_s_loses_no_request(app):
    pids = alive_pids(f"SERVE_DEPLOYMENT_ACTOR::{app.name}::", f"::batcher-{MODEL}")
    assert len(pids) == 1, pids
    before = app.stats(MODEL)
    ended: list[tuple[int, object]] = []
    counter = iter(range(10**9))
    resumed = asyncio.Event()
    resumed_at: list[int] = []  # requests ended by then

    async def caller(client: RaybatchClient) -> None:
        while not resumed.is_set() or len(ended) < resumed_at[0] + 10 * CALLERS:
            i = next(counter)
            try:
                got: object = (await client.infer(MODEL, x(i), {"timeout_s": 30}))["OUTPUT0"]
            except Exception as e:  # any failure is this test's
                got = e
            ended.append((i, got))

    async def main():
        client = RaybatchClient(app.handle)
        coalescer = (await client._route(MODEL)).shards[0]
        for i in range(1000):  # until the bundles go on the direct connection
            await client.infer(MODEL, x(i))
            if coalescer._dialer.live() is not None and coalescer.linked_bundles:
                break
            await asyncio.sleep(0.01)
        link = coalescer._dialer.live()
        assert link is not None, "no direct connection to the batching actor"
        callers = [asyncio.ensure_future(caller(client)) for _ in range(CALLERS)]
        while len(ended) < 4 * CALLERS:
            await asyncio.sleep(0.01)
        os.kill(pids[0], signal.SIGSTOP)
        try:
            await asyncio.sleep(PAUSE_S)  # the scenario's length, not a bound on anything
        finally:
            os.kill(pids[0], signal.SIGCONT)
        resumed_at.append(len(ended))
        resumed.set()
        await asyncio.gather(*callers)
        return link, coalescer._dialer.live()

    try:
        link, live = arun(main(), 120)
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pids[0], signal.SIGCONT)

    wrong = [(i, repr(got)[:200]) for i, got in ended if isinstance(got, BaseException)
             or not np.array_equal(got, np.array([i * i, (i + 0.5) ** 2], np.float32))]
    assert wrong == [], f"{len(wrong)} of {len(ended)} requests failed or wrong: {wrong[:3]}"
    assert link.spared >= 1 and live is link, "the silent connection was not kept"
    after = app.stats(MODEL)
    assert after["replica_deaths"] == before["replica_deaths"]
    assert alive_pids(f"SERVE_DEPLOYMENT_ACTOR::{app.name}::", f"::batcher-{MODEL}") == pids
