"""Soak and overload: every answer checked, memory watched.

Two apps of their own (beside the shared one), one ingress replica each, one model in a
batching actor each:
- `load`, model `sq`: x -> x² (deployments.models:Square), batches of 32. The soak sends
  RAYBATCH_SOAK_REQUESTS requests (default 2,000; the full run is 100,000),
  half through HTTP (Serve's proxy and the fast path, alternately), half through a
  `RaybatchClient`, 32 at a time on each path, and cancels 5% of them at a random
  moment (the HTTP client hangs up; the client's task is cancelled). Each request
  carries [i mod 4096, i div 4096], so its answer is its own and exact in FP32: 0 lost
  (every request ends), 0 wrong (every answer the caller got is its own), 0 duplicated
  (the batching actor ended no more requests than were sent, and failed none but
  cancels), 0 refused. Nothing may be refused because nothing here refuses by time: the
  app sets no timeout and `sq` no wait or count bound (with the 2 s timeout the soak once
  shared with the overload, a stalled machine made Serve's proxy take 2.4 s to hand the
  ingress a body, and the request was refused, honestly, with 429: how many depended on
  the machine, not the code).
- `overload`, model `slow`: SlowSquare, 500 ms per batch of at most 4: a capacity of at
  most 8 requests/s whatever the machine (the sleep is a floor; slow, so that 10x its
  capacity is the model's overload, not the 2-core test machine's HTTP front's). The
  overload sends 10x that, open loop (at a fixed rate, whatever the answers), for
  RAYBATCH_OVERLOAD_S seconds (default 6; the full run is 30) to the ingress replica's
  own port (the fast path, where `raybatch up`'s HAProxy sends requests), with
  `ingress.default_timeout_s: 2`. Every request gets an answer: 200 with its own result,
  or a clear refusal (429/503 with Retry-After and {"error": ...}); some are refused
  (the admission acts: the model cannot serve a tenth of them in time), at least one is
  served; the resident memory of the ingress replica and of the batching actor is flat;
  and right after, the model answers ten calm requests, each with its own answer. A 504
  is allowed only as the engine's DeadlineExceeded of a request whose deadline passed in
  the queue before it could run (what a stall of the machine between two admission
  checks can cause; its message is checked).
  How fast is a benchmark's, not this test's: the accepted requests' p99 against the
  timeout, that no request ends 504, the model kept busy, the calm latency
  (`python -m benchmarks.serve.reliability_times overload`; targets there). Figures are
  printed here too (run with -s).
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
from deployments.ingress.client import RaybatchClient
from tests.conftest import alive_pids, arun, direct_url, rss_bytes

# behaviour at the default sizes: in `make test`; `make soak` runs the same at full size
pytestmark = [pytest.mark.integration, pytest.mark.slow]

NAME, PREFIX = "load", "/load"  # the soak's app
OVERLOAD_NAME, OVERLOAD_PREFIX = "overload", "/overload"
SOAK_REQUESTS = int(os.environ.get("RAYBATCH_SOAK_REQUESTS", "2000"))
OVERLOAD_S = float(os.environ.get("RAYBATCH_OVERLOAD_S", "6"))
CANCEL_FRACTION = 0.05
CONCURRENCY = 32  # per path
SLOW_BATCH, SLOW_DELAY_MS = 4, 500.0
CAPACITY_RPS = SLOW_BATCH / (SLOW_DELAY_MS / 1e3)  # 8 requests/s
TIMEOUT_S = 2.0  # the overload app's ingress.default_timeout_s
CLIENT_TIMEOUT_S = 30.0  # an overload request with no answer by then hangs: the test fails
DEADLINE_PASSED = "passed its deadline before it could run"  # DeadlineExceeded's message
MEMORY_SLACK_BYTES = 64 << 20  # "flat": less than this gained in the overload's second half


TENSOR = {"datatype": "FP32", "shape": [-1]}


def load_app_config():
    """The soak's app: no timeout, no wait or count bound: nothing is refused."""
    return load_config({
        "app_name": NAME,
        "ingress": {"num_cpus": 0.05, "route_prefix": PREFIX, "drain_timeout_s": 2},
        "models": [
            {"name": "sq", "transformer": "deployments.models:Square",
             "inputs": [{"name": "INPUT0", **TENSOR}],
             "outputs": [{"name": "OUTPUT0", **TENSOR}],
             "batching": {"max_batch_size": 32, "max_queue_delay_s": 0.002},
             "limits": {"max_queue_wait_s": None, "queue_batches": None},
             "replicas": {"min_replicas": 1, "max_replicas": 1, "num_cpus": 0.05},
             "batcher": {"placement": "actor"}},
        ],
    })


def overload_app_config():
    """The overload's app: `slow` behind a 2 s timeout."""
    return load_config({
        "app_name": OVERLOAD_NAME,
        "ingress": {"num_cpus": 0.05, "route_prefix": OVERLOAD_PREFIX, "drain_timeout_s": 2,
                    "default_timeout_s": TIMEOUT_S},
        "models": [
            {"name": "slow", "transformer": "tests.models:SlowSquare",
             "init_kwargs": {"delay_ms": SLOW_DELAY_MS},
             "inputs": [{"name": "INPUT0", **TENSOR}],
             "outputs": [{"name": "OUTPUT0", **TENSOR}],
             "batching": {"max_batch_size": SLOW_BATCH},
             "replicas": {"min_replicas": 1, "max_replicas": 1, "num_cpus": 0.05},
             # The default queue bound (8 batches: 4 s of work, past TIMEOUT_S): what keeps
             # an accepted request within its timeout is the deadline admission.
             "batcher": {"placement": "actor"}},
        ],
    })


def deploy(config) -> tuple:
    """`config`'s app deployed beside the shared one: (its handle, its fast-path URL)."""
    from ray import serve

    from deployments.app import build_app

    handle = serve.run(build_app(config), name=config.app_name,
                       route_prefix=config.ingress.route_prefix)
    return handle, direct_url(config.app_name)


@pytest.fixture(scope="module")
def load_app(app):
    from ray import serve

    yield deploy(load_app_config())
    serve.delete(NAME)


@pytest.fixture(scope="module")
def overload_app(app):
    from ray import serve

    yield deploy(overload_app_config())
    serve.delete(OVERLOAD_NAME)


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
    # no timeout and no bound: a refusal here is a bug, not a slow machine
    assert not refused, f"{len(refused)} refused: {refused[:3]}"
    # duplicated: the actor ended no request twice, nor more requests than were sent; the
    # only failures it counted are cancels (a cancel that arrives after the answer is not)
    assert ended["success"] + ended["fail"] <= n
    assert ended["success"] >= answered and ended["fail"] <= at_actor_cancelled
    assert after["open_requests"] == 0 and after["queued_requests"] == 0


async def open_loop(url: str, rate: float, seconds: float, on_third
                    ) -> tuple[list[tuple], float]:
    """Request k leaves at k / rate s whatever came back; (sent, latency, status, body,
    retry_after, x) each (status -1: no answer within CLIENT_TIMEOUT_S), and how late the
    latest request left (this process's own stall). `on_third(k)` is called at one and
    two thirds of the run."""
    records: list[tuple] = []
    timeout = aiohttp.ClientTimeout(total=CLIENT_TIMEOUT_S)
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


def overload(url: str, pids: dict[str, list[int]], seconds: float = OVERLOAD_S
             ) -> tuple[list[tuple], dict[str, list[int]]]:
    """10x the capacity, open loop, for `seconds`: the records (see `open_loop`) and the
    resident memory of each process in `pids` at the start, 1/3, 2/3 and the end.
    Prints what came back."""
    memory: dict[str, list[int]] = {k: [rss_bytes(p[0])] for k, p in pids.items()}

    def sample(_third: int) -> None:
        for k, p in pids.items():
            memory[k].append(rss_bytes(p[0]))

    rate = 10 * CAPACITY_RPS
    records, late = arun(open_loop(url, rate, seconds, sample), timeout_s=seconds + 120)
    sample(3)
    counts: dict[int, int] = {}
    for r in records:
        counts[r[2]] = counts.get(r[2], 0) + 1
    accepted = sorted(r[1] for r in records if r[2] == 200) or [float("nan")]
    mib = {k: [round(v / 2**20, 1) for v in vs] for k, vs in memory.items()}
    retry_after = sorted({str(r[4]) for r in records if r[2] != 200})
    print(f"overload at {rate:.0f}/s (10x capacity) for {seconds:.0f} s: {len(records)} "
          f"requests, statuses {counts} (Retry-After values {retry_after}); accepted p50 "
          f"{accepted[len(accepted) // 2]:.3f} s, p99 "
          f"{accepted[int(0.99 * (len(accepted) - 1))]:.3f} s, max {accepted[-1]:.3f} s "
          f"(timeout {TIMEOUT_S} s); the client sent up to {late:.3f} s late; RSS MiB "
          f"(before, 1/3, 2/3, end): {mib}")
    return records, memory


def check_overload_answers(records: list[tuple]) -> dict[int, int]:
    """Each answer is 200 with its own x², a refusal (429/503) with Retry-After and
    {"error": ...}, or the engine's DeadlineExceeded (504) of a request whose deadline
    passed in the queue; none is missing. Counts by status."""
    counts: dict[int, int] = {}
    for _sent, _latency, status, body, retry, x in records:
        counts[status] = counts.get(status, 0) + 1
        assert status != -1, f"request x={x} got no answer within {CLIENT_TIMEOUT_S} s"
        if status == 200:
            assert body == answer_of("slow", [x * x]), (x, body)
        elif status in (429, 503):
            assert retry and isinstance(body, dict) and body.get("error"), (status, body, retry)
        else:
            assert status == 504 and isinstance(body, dict), (status, body)
            assert DEADLINE_PASSED in body.get("error", ""), body
    return counts


def calm(url: str, n: int = 10) -> list[tuple]:
    """`n` requests one at a time: (status, body, latency, when it was answered) each."""
    async def main():
        async with aiohttp.ClientSession() as s:
            out = []
            for x in range(n):
                t = time.monotonic()
                async with s.post(url, json=doc([float(x)])) as r:
                    out.append((r.status, await r.json(), time.monotonic() - t,
                                time.monotonic()))
            return out
    return arun(main())


def overload_pids() -> dict[str, list[int]]:
    return {"ingress": alive_pids(f"SERVE_REPLICA::{OVERLOAD_NAME}#Ingress#"),
            "batching actor": alive_pids(f"SERVE_DEPLOYMENT_ACTOR::{OVERLOAD_NAME}::",
                                         "::batcher-slow")}


def test_overload_at_10x_capacity_answers_200_or_429_and_memory_stays_flat(
        app, overload_app):
    url = f"{overload_app[1]}{OVERLOAD_PREFIX}/v2/models/slow/infer"  # the fast path
    pids = overload_pids()
    assert all(len(p) == 1 for p in pids.values()), pids
    records, memory = overload(url, pids)
    assert len(records) == int(10 * CAPACITY_RPS * OVERLOAD_S)  # one record per request
    counts = check_overload_answers(records)
    # 10x what the model can serve (its sleep is a floor, whatever the machine): the
    # admission refuses some, and what it takes is served
    assert counts.get(429, 0) > 0 and counts.get(200, 0) > 0, counts
    for k, vs in memory.items():
        assert vs[-1] - vs[1] < MEMORY_SLACK_BYTES, \
            f"{k} grew: {[round(v / 2**20, 1) for v in vs]} MiB"

    answers = calm(url)  # normal service right away: one request at a time, all answered
    print(f"back to normal service {answers[0][3] - max(r[0] for r in records):.2f} s after "
          f"the last overload request was sent (the first calm answer; calm latencies max "
          f"{max(a[2] for a in answers):.3f} s)")
    assert [(st, b) for st, b, *_ in answers] == [
        (200, answer_of("slow", [float(x * x)])) for x in range(10)]
