"""Faults under load: a part is killed or breaks while requests run, and every
answer is checked.

An app of its own (`faults`, beside the shared one: what is killed here must not be the
shared app's), two ingress replicas and three small models:
- `slow`: SlowSquare (x -> x², 5 ms per batch of 8) in a batching actor. SIGKILL of the
  batching actor, then of an ingress replica, under closed-loop HTTP load: each answer
  is x² of its own x or a clear error (503 `WorkerDied` with {"error": ...}; Serve's
  proxy answers 5xx for a request whose ingress replica died), nothing hangs, Serve
  recreates what was killed, and traffic is all 200 again: RECOVERED_AFTER requests in a
  row succeed after the last one that failed.
- `hang`: a batch with a negative item never ends. `replicas.batch_timeout_s: 2`: that
  batch fails with 504 `BatchTimedOut` (not before its timeout), its replica is stopped
  and replaced, and the requests around it (batches of one) get their answers.
- `partial`: a negative item fails alone (`ItemFailed`): in mixed batches only the
  requests carrying one fail (500, the model's message), every other gets x + 1. The
  batches are mixed for certain: the 400 requests wait at a closed gate until (nearly)
  all are queued, so they leave in full batches.
`hang` and `partial` read ahead, so their batches go on the engine's direct connection
to the replica (`replicas.link`): a hang and a model's errors are told apart there too.

No test here times anything: how soon traffic recovers after a kill (the target: all 200
within 30 s) and how soon a hung batch is answered are measured by
`python -m benchmarks.serve.reliability_times recovery`. The waits below are only
bounds on a hang (HANG_S), far past any of those.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import time

import aiohttp
import pytest

from cluster.config import load_config
from tests.conftest import alive_pids, arun, wait_until
from tests.models import FailNegative

pytestmark = [pytest.mark.integration, pytest.mark.slow]

NAME, PREFIX = "faults", "/faults"
RECOVERED_AFTER = 100  # requests in a row answered 200 after the last failure: recovered
HANG_S = 180.0  # no recovery, replacement or answer by then: it hangs (never a speed bound)
HANG_TIMEOUT_S = 2.0
CLIENT_TIMEOUT_S = 60.0  # a request with no answer by then "hangs": the test fails
BODY_TIMEOUT_S = 5.0  # the ingress's body_timeout_s: see the ingress-kill test


def _model(name: str, transformer: str, **extra) -> dict:
    return {"name": name, "transformer": transformer,
            "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1]}],
            "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1]}],
            "replicas": {"min_replicas": 1, "max_replicas": 1, "num_cpus": 0.05,
                         **extra.pop("replicas", {})},
            "batcher": {"placement": "actor"},
            **extra}


class HeldFailNegative(FailNegative):
    """FailNegative whose batches wait while the file `gate_path` exists (at most 60 s)."""

    def __init__(self, gate_path: str) -> None:
        self.gate_path = gate_path

    def transform(self, xs):
        give_up = time.monotonic() + 60
        while os.path.exists(self.gate_path) and time.monotonic() < give_up:
            time.sleep(0.005)
        return super().transform(xs)


def faults_config(gate_path: str = "/nonexistent/gate"):
    return load_config({
        "app_name": NAME,
        "ingress": {"num_replicas": 2, "num_cpus": 0.05, "route_prefix": PREFIX,
                    "drain_timeout_s": 2, "body_timeout_s": BODY_TIMEOUT_S},
        "models": [
            _model("slow", "tests.models:SlowSquare", init_kwargs={"delay_ms": 5},
                   batching={"max_batch_size": 8}),
            _model("hang", "tests.models:HangOnNegative", batching={"max_batch_size": 1},
                   replicas={"batch_timeout_s": HANG_TIMEOUT_S, "read_ahead": True},
                   # the 60 requests around it all wait (by count: it hangs on purpose)
                   limits={"queue_batches": 128, "max_queue_wait_s": None},
                   warmup={"enabled": False}),
            _model("partial", "tests.integration.test_faults:HeldFailNegative",
                   init_kwargs={"gate_path": gate_path},
                   batching={"max_batch_size": 16, "max_queue_delay_s": 0.005},
                   replicas={"read_ahead": True},
                   # its 400 requests wait at the closed gate: by count, not time
                   limits={"queue_batches": 128, "max_queue_wait_s": None},
                   warmup={"enabled": False}),
        ],
    })


@pytest.fixture(scope="module")
def gate_file(tmp_path_factory):
    """While this file exists, the `partial` model holds its batches."""
    gate = tmp_path_factory.mktemp("faults-gate") / "closed"
    yield gate
    gate.unlink(missing_ok=True)


@pytest.fixture(scope="module")
def faults(app, gate_file):
    from ray import serve

    from deployments.app import build_app

    handle = serve.run(build_app(faults_config(str(gate_file))), name=NAME,
                       route_prefix=PREFIX)
    yield handle
    serve.delete(NAME)


def stats(handle, model: str) -> dict:
    return handle.status.remote().result(timeout_s=30)[model]


BATCHER = (f"SERVE_DEPLOYMENT_ACTOR::{NAME}::", "::batcher-slow")
INGRESS = (f"SERVE_REPLICA::{NAME}#Ingress#",)


def body(x: float) -> dict:
    return {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [x]}]}


async def post(session: aiohttp.ClientSession, url: str, x: float) -> tuple:
    """(status, parsed body or text, Retry-After); status 0 for a broken connection."""
    try:
        async with session.post(url, json=body(x)) as r:
            text = await r.text()
            try:
                doc = await r.json(content_type=None)
            except ValueError:
                doc = text
            return r.status, doc, r.headers.get("retry-after")
    except aiohttp.ClientConnectionError as e:
        return 0, repr(e), None


class Load:
    """Closed-loop HTTP load on one model: `clients` loops, each sending distinct inputs
    and recording (time, x, status, body, retry_after) for every request it sent."""

    def __init__(self, url: str, clients: int = 16) -> None:
        self.url, self.clients = url, clients
        self.records: list[tuple] = []
        self.stop = False
        self._next = 0

    async def run(self) -> None:
        timeout = aiohttp.ClientTimeout(total=CLIENT_TIMEOUT_S)
        async with aiohttp.ClientSession(timeout=timeout,
                                         connector=aiohttp.TCPConnector(limit=0)) as s:
            await asyncio.gather(*(self._loop(s) for _ in range(self.clients)))

    async def _loop(self, session: aiohttp.ClientSession) -> None:
        while not self.stop:
            x = float(self._next)
            self._next += 1
            try:
                status, doc, retry = await post(session, self.url, x)
            except asyncio.TimeoutError:  # no answer within CLIENT_TIMEOUT_S: a hang
                status, doc, retry = -1, "no answer", None
            self.records.append((time.monotonic(), x, status, doc, retry))
            if status != 200:
                await asyncio.sleep(0.01)  # a failing server is not hammered in a tight loop

    def ok(self, record: tuple) -> bool:
        _, x, status, doc, _ = record
        return status == 200 and doc["outputs"][0]["data"] == [x * x]


async def kill_under_load(load: Load, pids: list[int]) -> tuple:
    """Run `load`, SIGKILL `pids` once it answers, and stop once RECOVERED_AFTER requests
    in a row succeeded after the last one that failed; returns (kill time, when the last
    failure came back: the kill's time if none failed). Fails if that never happens within
    HANG_S."""
    task = asyncio.ensure_future(load.run())
    while sum(load.ok(r) for r in load.records) < 100:
        assert not task.done(), "the load stopped before the kill"
        await asyncio.sleep(0.02)
    killed = time.monotonic()
    for pid in pids:
        os.kill(pid, signal.SIGKILL)
    try:
        while True:
            await asyncio.sleep(0.1)
            assert not task.done(), "the load stopped"
            late = [r for r in load.records if r[0] > killed]  # in the order they came back
            last_bad = max((k for k, r in enumerate(late) if not load.ok(r)), default=-1)
            if len(late) - last_bad - 1 >= RECOVERED_AFTER:
                break
            assert time.monotonic() - killed < HANG_S, \
                f"traffic not all 200 again {HANG_S:.0f} s after the kill: " \
                f"{[r[2:4] for r in late[-3:]]}"
    finally:
        load.stop = True
        await task
    return killed, late[last_bad][0] if last_bad >= 0 else killed


def check_answers(load: Load, allowed: set[int]) -> dict:
    """Every answer its own x² or an error of an `allowed` status with {"error": ...}
    (and Retry-After on 503); no hang, nothing else. Counts by status."""
    counts: dict = {}
    for r in load.records:
        _, x, status, doc, retry = r
        counts[status] = counts.get(status, 0) + 1
        assert status != -1, f"request x={x} got no answer within {CLIENT_TIMEOUT_S} s"
        if status == 200:
            assert load.ok(r), f"request x={x} got someone else's answer: {doc}"
            continue
        assert status in allowed, f"request x={x}: unexpected {status} {doc!r}"
        if status == 503 and isinstance(doc, dict):
            assert doc.get("error") and retry, (doc, retry)
    return counts


def test_sigkill_of_the_batching_actor_fails_only_its_requests_and_traffic_recovers(
        app, faults):
    pids = alive_pids(*BATCHER)
    assert len(pids) == 1, pids
    load = Load(f"{app.base_url}{PREFIX}/v2/models/slow/infer")
    killed, recovered = arun(kill_under_load(load, pids), timeout_s=HANG_S + 60)
    counts = check_answers(load, allowed={503})
    print(f"batching actor SIGKILL: {counts}, last failure {recovered - killed:.2f} s after")
    assert counts[200] > 100
    new = wait_until(lambda: alive_pids(*BATCHER), timeout_s=HANG_S, what="a new batching actor")
    assert new != pids


def test_sigkill_of_an_ingress_replica_fails_only_its_requests_and_traffic_recovers(
        app, faults):
    from ray import serve

    pids = alive_pids(*INGRESS)
    assert len(pids) == 2, pids
    load = Load(f"{app.base_url}{PREFIX}/v2/models/slow/infer")
    killed, recovered = arun(kill_under_load(load, pids[:1]), timeout_s=HANG_S + 60)
    # Requests that were in the killed replica end with Serve's proxy error (5xx); none
    # is answered wrong or left without an answer. Seen in one of two runs: Serve's proxy
    # sent a request whose replica died on to the other one without its body, which
    # waited body_timeout_s for it and answered 408 (the proxy's, not Raybatch's, to fix).
    counts = check_answers(load, allowed={408, 500, 502, 503})
    print(f"ingress replica SIGKILL: {counts}, last failure {recovered - killed:.2f} s after")

    def back():
        deps = serve.status().applications[NAME].deployments
        running = deps["Ingress"].replica_states.get("RUNNING", 0)
        return running == 2 and len(alive_pids(*INGRESS)) == 2
    wait_until(back, timeout_s=HANG_S, what="Serve to run 2 ingress replicas again")


def test_a_hung_batch_fails_with_its_timeout_and_its_replica_is_replaced(app, faults):
    url = f"{app.base_url}{PREFIX}/v2/models/hang/infer"
    before = stats(faults, "hang")

    async def main():
        # they wait for the hung batch's timeout and its replica's replacement: no
        # answer within HANG_S is a hang
        timeout = aiohttp.ClientTimeout(total=HANG_S)
        async with aiohttp.ClientSession(timeout=timeout) as s:
            around = [asyncio.ensure_future(post(s, url, float(i))) for i in range(20)]
            await asyncio.sleep(0.05)
            t0 = time.monotonic()
            hung = asyncio.ensure_future(post(s, url, -1.0))
            around += [asyncio.ensure_future(post(s, url, float(i))) for i in range(20, 60)]
            hung_answer = await hung
            waited = time.monotonic() - t0
            return hung_answer, waited, await asyncio.gather(*around)

    (status, doc, _), waited, around = arun(main(), timeout_s=HANG_S + 60)
    assert status == 504, (status, doc)
    assert "batch_timeout_s" in doc["error"], doc
    assert waited >= HANG_TIMEOUT_S, waited  # ended by its timeout, not before it
    # batches of one: nobody else was in the hung batch, so everybody else gets an answer
    wrong = [(i, a) for i, a in enumerate(around)
             if a[:2] != (200, {"model_name": "hang", "model_version": "1", "outputs": [
                 {"name": "OUTPUT0", "datatype": "FP32", "shape": [1], "data": [i + 1.0]}]})]
    assert not wrong, wrong[:3]

    def replaced():
        s = stats(faults, "hang")
        alive = [r for r in s["replica_info"] if r["state"] == "ALIVE"]
        return s["replica_deaths"] == before["replica_deaths"] + 1 and len(alive) == 1
    wait_until(replaced, timeout_s=HANG_S, what="the hung replica to be replaced")


def test_a_model_that_fails_some_items_fails_only_their_requests(app, faults, gate_file):
    url = f"{app.base_url}{PREFIX}/v2/models/partial/infer"
    rng = random.Random(3)
    xs = [float(i) if rng.random() > 0.2 else -float(i) - 1 for i in range(400)]

    async def main():
        async with aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=HANG_S),
                connector=aiohttp.TCPConnector(limit=0)) as s:
            tasks = [asyncio.ensure_future(post(s, url, x)) for x in xs]
            give_up = time.monotonic() + HANG_S
            # every request at the engine (queued, or in a batch the gate holds) or already
            # answered (through Serve's proxy a busy machine can stall a body past the
            # ingress's body timeout: a clear 408, checked below)
            while (await faults.status.remote())["partial"]["open_requests"] + sum(
                    t.done() for t in tasks) < len(xs):
                assert time.monotonic() < give_up, "the requests never reached the engine"
                await asyncio.sleep(0.05)
            gate_file.unlink()  # they leave the queue in full batches
            return await asyncio.gather(*tasks)

    before = stats(faults, "partial")
    gate_file.touch()
    try:
        answers = arun(main(), timeout_s=HANG_S + 60)
    finally:
        gate_file.unlink(missing_ok=True)
    reached = 0
    for x, (status, doc, _) in zip(xs, answers):
        if status in (408, 429, 503):  # refused before the model, saying why
            assert isinstance(doc, dict) and doc.get("error"), (x, status, doc)
            continue
        reached += 1
        if x < 0:
            assert status == 500, (x, status, doc)
            assert doc["error"] == f"the model raised ValueError: negative input {x}: " \
                                   "this model takes x >= 0", doc
        else:
            assert status == 200, (x, status, doc)
            assert doc["outputs"][0]["data"] == [x + 1], (x, doc)
    after = stats(faults, "partial")
    batches = after["batches"] - before["batches"]
    assert reached >= len(xs) // 2, f"only {reached} of {len(xs)} reached the model"
    assert batches < reached / 2, "the batches were not mixed: the test proves nothing"
