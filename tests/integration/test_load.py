"""Soak and overload: every answer checked, memory watched.

An app of its own (`load`, beside the shared one), one ingress replica, two models in
batching actors:
- `sq`: x -> x² (deployments.models:Square), batches of 32. The soak sends
  RAYBATCH_SOAK_REQUESTS requests (default 2,000; the full run is 100,000),
  half through HTTP (Serve's proxy and the fast path, alternately), half through a
  `RaybatchClient`, 32 at a time on each path, and cancels 5% of them at a random
  moment (the HTTP client hangs up; the client's task is cancelled). Each request
  carries [i mod 4096, i div 4096], so its answer is its own and exact in FP32: 0 lost
  (every request ends), 0 wrong (every answer the caller got is its own), 0 duplicated
  (the batching actor ended no more requests than were sent, and failed none). An HTTP
  429 with Retry-After and {"error": ...} is an honest refusal, not a wrong answer
  (nothing of it ran: a client retries it); at most 1% may be: on a busy machine Serve's
  proxy took 2.4 s to hand the ingress a body, past the 2 s timeout counted from the
  request's head.
- `slow`: SlowSquare, 500 ms per batch of at most 4: a capacity of 8 requests/s (slow,
  so that 10x its capacity is the model's overload, not the 2-core test machine's HTTP
  front's). The overload sends 10x that, open loop (at a fixed rate, whatever the
  answers), for RAYBATCH_OVERLOAD_S seconds (default 6; the full run is 30) to
  the ingress replica's own port (the fast path, where `raybatch up`'s HAProxy sends
  requests): every answer is 200 with its own result or 429/503 with Retry-After and
  {"error": ...}; the accepted requests' p99 stays within the ingress's
  default_timeout_s (the model's queue bound alone would let them wait 4 s: what holds
  them to it is the engine's deadline admission, `batching.dynamic.admission`); the
  resident memory of the ingress replica and of the batching actor is flat; and right
  after, the model answers normally. Figures are printed (run with -s). The p99 is a time
  on a shared machine: one past the bound is measured once more before it fails.
  Not through Serve's proxy: measured on this machine, under this overload the proxy
  itself (its queue before the ingress, the round trip that fetches the body from it,
  the response back through it) added 1-3 s to an accepted request's p99, time no code
  in the replica sees (benchmarks/results/2026-11-23-http-cpu/reliability.md).
"""

from __future__ import annotations

import asyncio
import json
import os
import random
import threading
import time

import aiohttp
import numpy as np
import pytest

from cluster.config import load_config
from deployments.client import RaybatchClient
from tests.conftest import alive_pids, arun, direct_url, rss_bytes

pytestmark = [pytest.mark.integration, pytest.mark.soak]

NAME, PREFIX = "load", "/load"
SOAK_REQUESTS = int(os.environ.get("RAYBATCH_SOAK_REQUESTS", "2000"))
OVERLOAD_S = float(os.environ.get("RAYBATCH_OVERLOAD_S", "6"))
CANCEL_FRACTION = 0.05
CONCURRENCY = 32  # per path
SLOW_BATCH, SLOW_DELAY_MS = 4, 500.0
CAPACITY_RPS = SLOW_BATCH / (SLOW_DELAY_MS / 1e3)  # 8 requests/s
TIMEOUT_S = 2.0  # the ingress's default_timeout_s
# An accepted request ends within its timeout, counted from when the ingress got it; the
# allowance is for what the engine cannot see: the HTTP hops and the Ray calls to the
# batching actor and back (a few ms idle, more on the shared 2-core machine).
ACCEPTED_BOUND_S = TIMEOUT_S + 0.25
MEMORY_SLACK_BYTES = 64 << 20  # "flat": less than this gained in the overload's second half


def load_app_config():
    tensor = {"datatype": "FP32", "shape": [-1]}
    return load_config({
        "app_name": NAME,
        "ingress": {"num_cpus": 0.05, "route_prefix": PREFIX, "drain_timeout_s": 2,
                    "default_timeout_s": TIMEOUT_S},
        "models": [
            {"name": "sq", "transformer": "deployments.models:Square",
             "inputs": [{"name": "INPUT0", **tensor}],
             "outputs": [{"name": "OUTPUT0", **tensor}],
             "batching": {"max_batch_size": 32, "max_queue_delay_s": 0.002},
             "replicas": {"min_replicas": 1, "max_replicas": 1, "num_cpus": 0.05},
             "batcher": {"placement": "actor"}},
            {"name": "slow", "transformer": "tests.models:SlowSquare",
             "init_kwargs": {"delay_ms": SLOW_DELAY_MS},
             "inputs": [{"name": "INPUT0", **tensor}],
             "outputs": [{"name": "OUTPUT0", **tensor}],
             "batching": {"max_batch_size": SLOW_BATCH},
             "replicas": {"min_replicas": 1, "max_replicas": 1, "num_cpus": 0.05},
             # The default queue bound (8 batches: 4 s of work, past TIMEOUT_S): what keeps
             # an accepted request within its timeout is the deadline admission.
             "batcher": {"placement": "actor"}},
        ],
    })


@pytest.fixture(scope="module")
def load_app(app):
    from ray import serve

    from deployments.app import build_app

    handle = serve.run(build_app(load_app_config()), name=NAME, route_prefix=PREFIX)
    yield handle, direct_url(NAME)
    serve.delete(NAME)


def stats(handle, model: str) -> dict:
    return handle.status.remote().result(timeout_s=30)[model]


def pair(i: int) -> list[float]:
    return [float(i % 4096), float(i // 4096)]


def doc(xs: list[float]) -> dict:
    return {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [len(xs)],
                        "data": xs}]}


def answer_of(model: str, ys: list[float]) -> dict:
    return {"model_name": model, "model_version": "1", "outputs": [
        {"name": "OUTPUT0", "datatype": "FP32", "shape": [len(ys)], "data": ys}]}


async def run_with_cancels(call, ids: list[int], doomed: dict[int, float]) -> dict:
    """`call(i)` for each i in `ids`, CONCURRENCY at once, cancelling `doomed` ones after
    their delay. {i: its result, the exception it raised, or "cancelled"}."""
    out: dict = {}
    sem = asyncio.Semaphore(CONCURRENCY)

    async def one(i: int) -> None:
        async with sem:
            task = asyncio.ensure_future(call(i))
            if i in doomed:
                asyncio.get_running_loop().call_later(doomed[i], task.cancel)
            try:
                out[i] = await task
            except asyncio.CancelledError:
                out[i] = "cancelled"
            except Exception as e:  # counted as lost/wrong by the caller
                out[i] = e
    await asyncio.gather(*(one(i) for i in ids))
    return out


async def soak_http(urls: list[str], ids: list[int], doomed: dict[int, float]) -> dict:
    """Send request i (i in `ids`, every other one) to urls[i // 2 % 2]; hang up on
    `doomed` ones after their delay. {i: (status, body), an exception, or "cancelled"}."""
    timeout = aiohttp.ClientTimeout(total=60)
    async with aiohttp.ClientSession(timeout=timeout,
                                     connector=aiohttp.TCPConnector(limit=0)) as s:
        async def call(i: int):
            async with s.post(urls[i // 2 % 2], json=doc(pair(i))) as r:
                body = await r.json(content_type=None)
                if r.status == 429:  # refused: what a client retries after Retry-After
                    return r.status, body, r.headers.get("Retry-After")
                return r.status, body
        return await run_with_cancels(call, ids, doomed)


async def soak_client(client: RaybatchClient, ids: list[int], doomed: dict[int, float]) -> dict:
    return await run_with_cancels(
        lambda i: client.infer("sq", {"INPUT0": np.array(pair(i), np.float32)}), ids, doomed)


class RssSampler:
    """Resident memory of some processes every EVERY_S seconds, on a thread of its own,
    while the block runs: whether memory levels off, not only where it ended."""

    EVERY_S = 10.0

    def __init__(self, pids: dict[str, int]) -> None:
        self.pids = pids
        self.series: dict[str, list[float]] = {k: [] for k in pids}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while True:
            for k, pid in self.pids.items():
                try:
                    self.series[k].append(round(rss_bytes(pid) / 2**20, 1))
                except OSError:  # the process is gone: the test says so itself
                    pass
            if self._stop.wait(self.EVERY_S):
                return

    def __enter__(self) -> dict[str, list[float]]:
        self._thread.start()
        return self.series

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def test_soak_with_random_cancels_loses_mixes_and_duplicates_nothing(app, load_app):
    handle, direct = load_app
    n, rng = SOAK_REQUESTS, random.Random(11)
    doomed = {i: rng.uniform(0, 0.01) for i in range(n) if rng.random() < CANCEL_FRACTION}
    urls = [f"{base}{PREFIX}/v2/models/sq/infer" for base in (app.base_url, direct)]
    http_ids, client_ids = list(range(0, n, 2)), list(range(1, n, 2))
    before = stats(handle, "sq")
    pids = {"ingress": alive_pids(f"SERVE_REPLICA::{NAME}#Ingress#"),
            "batching actor": alive_pids(f"SERVE_DEPLOYMENT_ACTOR::{NAME}::", "::batcher-sq")}
    rss = {k: [rss_bytes(p[0])] for k, p in pids.items() if len(p) == 1}

    async def main():
        client = RaybatchClient(handle)
        return await asyncio.gather(soak_http(urls, http_ids, doomed),
                                    soak_client(client, client_ids, doomed))

    t0 = time.monotonic()
    with RssSampler({k: p[0] for k, p in pids.items() if len(p) == 1}) as series:
        http, direct_calls = arun(main(), timeout_s=600)
    took = time.monotonic() - t0
    after = stats(handle, "sq")
    lost = [i for i in range(n) if i not in http and i not in direct_calls]
    wrong, refused, cancelled, answered = [], [], 0, 0
    for i in range(n):
        want = [x * x for x in pair(i)]
        got = http.get(i, direct_calls.get(i))
        if got == "cancelled":
            cancelled += 1
            assert i in doomed, f"request {i} was cancelled but nobody cancelled it"
            continue
        if isinstance(got, tuple) and got[0] == 429:
            _, body, retry_after = got
            assert set(body) == {"error"} and retry_after, (i, got)
            refused.append((i, body["error"]))
            continue
        ok = (got == (200, answer_of("sq", want)) if i in http else
              isinstance(got, dict) and got["OUTPUT0"].tolist() == want)
        answered += ok
        if not ok:
            wrong.append((i, got))
    ended = {k: after[k]["count"] - before[k]["count"] for k in ("success", "fail")}
    at_actor_cancelled = after["cancelled_by_caller"] - before["cancelled_by_caller"]
    for k, p in pids.items():
        if k in rss:
            rss[k].append(rss_bytes(p[0]))
    statuses: dict = {}
    for got in http.values():
        key = (got[0] if isinstance(got, tuple)
               else got if got == "cancelled" else type(got).__name__)
        statuses[key] = statuses.get(key, 0) + 1
    print(f"\nsoak: {n} requests in {took:.1f} s ({n / took:.0f}/s), {len(doomed)} cancels "
          f"sent, {cancelled} took effect at the caller, {at_actor_cancelled} at the batching "
          f"actor; answered {answered}, refused {len(refused)}, lost {len(lost)}, wrong "
          f"{len(wrong)}; the actor "
          f"ended {ended['success']} with a result, {ended['fail']} failed; HTTP statuses "
          f"{statuses}; RSS MiB (before, after): "
          f"{ {k: [round(v / 2**20, 1) for v in vs] for k, vs in rss.items()} }; RSS MiB "
          f"every {RssSampler.EVERY_S:.0f} s: {series}")
    assert not lost, f"{len(lost)} requests never ended: {lost[:5]}"
    assert not wrong, f"{len(wrong)} wrong or failed answers: {wrong[:3]}"
    assert len(refused) <= 0.01 * n, f"{len(refused)} refused: {refused[:3]}"
    # duplicated: the actor ended no request twice, nor more requests than were sent; the
    # only failures it counted are cancels (a cancel that arrives after the answer is not)
    assert ended["success"] + ended["fail"] <= n
    assert ended["success"] >= answered and ended["fail"] <= at_actor_cancelled
    assert after["open_requests"] == 0 and after["queued_requests"] == 0


async def open_loop(url: str, rate: float, seconds: float, on_third
                    ) -> tuple[list[tuple], float]:
    """Request k leaves at k / rate s whatever came back; (sent, latency, status, body,
    retry_after, x) each, and how late the latest request left (this process's own stall).
    `on_third(k)` is called at one and two thirds of the run."""
    records: list[tuple] = []
    timeout = aiohttp.ClientTimeout(total=30)
    async with aiohttp.ClientSession(timeout=timeout,
                                     connector=aiohttp.TCPConnector(limit=0)) as s:
        async def one(x: float) -> None:
            sent = time.monotonic()
            try:
                async with s.post(url, json=doc([x])) as r:
                    raw = await r.read()
                    try:
                        body = json.loads(raw)
                    except ValueError:  # not JSON: kept as it came, the checks show it
                        body = (raw[:200], dict(r.headers))
                    records.append((sent, time.monotonic() - sent, r.status, body,
                                    r.headers.get("retry-after"), x))
            except asyncio.TimeoutError:
                records.append((sent, time.monotonic() - sent, -1, None, None, x))
        tasks, t0, total, late = [], time.monotonic(), int(rate * seconds), 0.0
        thirds = {total // 3: 1, 2 * total // 3: 2}
        for k in range(total):
            delay = t0 + k / rate - time.monotonic()
            if delay > 0:
                await asyncio.sleep(delay)
            late = max(late, time.monotonic() - t0 - k / rate)
            if k in thirds:
                on_third(thirds[k])
            tasks.append(asyncio.ensure_future(one(float(k % 4096))))
        await asyncio.gather(*tasks)
        print(f"\noverload: sent {total} in {time.monotonic() - t0:.1f} s")
    return records, late


def overload(url: str, pids: dict[str, list[int]]) -> tuple[list[tuple], float]:
    """10x the capacity, open loop, for OVERLOAD_S: the records and the accepted
    requests' p99. Every answer, the model kept busy and the resident memory of each
    process in `pids` (before, 1/3, 2/3, end) are checked here."""
    memory: dict[str, list[int]] = {k: [rss_bytes(p[0])] for k, p in pids.items()}

    def sample(_third: int) -> None:
        for k, p in pids.items():
            memory[k].append(rss_bytes(p[0]))

    rate = 10 * CAPACITY_RPS
    records, late = arun(open_loop(url, rate, OVERLOAD_S, sample), timeout_s=OVERLOAD_S + 120)
    sample(3)
    counts: dict[int, int] = {}
    for _sent, _latency, status, body, retry, x in records:
        counts[status] = counts.get(status, 0) + 1
        assert status in (200, 429, 503), (status, body)
        if status == 200:
            assert body == answer_of("slow", [x * x]), (x, body)
        else:
            assert retry and isinstance(body, dict) and body.get("error"), (status, body, retry)
    accepted = sorted(r[1] for r in records if r[2] == 200)
    p99 = accepted[int(0.99 * (len(accepted) - 1))]
    mib = {k: [round(v / 2**20, 1) for v in vs] for k, vs in memory.items()}
    retry_after = sorted({r[4] for r in records if r[2] != 200})
    print(f"overload at {rate:.0f}/s (10x capacity) for {OVERLOAD_S:.0f} s: {len(records)} "
          f"requests, statuses {counts} (Retry-After values {retry_after}); accepted p50 "
          f"{accepted[len(accepted) // 2]:.3f} s, p99 {p99:.3f} s, max {accepted[-1]:.3f} s "
          f"(timeout {TIMEOUT_S} s); the client sent up to {late:.3f} s late; RSS MiB "
          f"(before, 1/3, 2/3, end): {mib}")
    assert len(accepted) >= 0.5 * CAPACITY_RPS * OVERLOAD_S, "the model was not kept busy"
    for k, vs in memory.items():
        assert vs[-1] - vs[1] < MEMORY_SLACK_BYTES, f"{k} grew: {mib[k]} MiB"
    return records, p99


def test_overload_at_10x_capacity_answers_200_or_429_and_memory_stays_flat(app, load_app):
    url = f"{load_app[1]}{PREFIX}/v2/models/slow/infer"  # the fast path (note on top)
    pids = {"ingress": alive_pids(f"SERVE_REPLICA::{NAME}#Ingress#"),
            "batching actor": alive_pids(f"SERVE_DEPLOYMENT_ACTOR::{NAME}::", "::batcher-slow")}
    assert all(len(p) == 1 for p in pids.values()), pids
    # The p99 is a time on a shared 2-core machine, where the other test lane may be
    # starting a Ray cluster of its own: a stall of the machine delays every request in
    # flight, whatever the engine planned. So a p99 past the bound runs the overload once
    # more (both printed); a broken admission misses it both times (without it accepted
    # requests wait for the whole 4 s queue). Every other check holds for every run.
    for attempt in (1, 2):
        records, p99 = overload(url, pids)
        if p99 <= ACCEPTED_BOUND_S:
            break
        print(f"run {attempt}: accepted p99 {p99:.2f} s exceeds {ACCEPTED_BOUND_S} s")
    assert p99 <= ACCEPTED_BOUND_S, f"accepted p99 {p99:.2f} s exceeds {ACCEPTED_BOUND_S} s"

    async def after():  # normal service right away: one request at a time, all answered
        async with aiohttp.ClientSession() as s:
            out = []
            for x in range(10):
                t = time.monotonic()
                async with s.post(url, json=doc([float(x)])) as r:
                    out.append((r.status, await r.json(), time.monotonic() - t))
                if x == 0:
                    first_answer.append(time.monotonic())
            return out
    first_answer: list[float] = []
    calm = arun(after())
    last_sent = max(r[0] for r in records)
    print(f"back to normal service {first_answer[0] - last_sent:.2f} s after the last "
          f"overload request was sent (the first calm answer; calm latencies max "
          f"{max(t for *_, t in calm):.3f} s)")
    assert [(st, b) for st, b, _ in calm] == [
        (200, answer_of("slow", [float(x * x)])) for x in range(10)]
    assert max(t for *_, t in calm) < 1.0, calm
