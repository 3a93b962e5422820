"""Every bad request gets its 4xx/5xx and a JSON `{"error": ...}` that says what was wrong.

Raw HTTP (httpx) against the shared app. Queue-full and deadline cases use the
`gated` model (one batch of one item at a time, held while the gate is closed),
so "the replica is busy" is a state the test sets, not a race it hopes to win.
"""

from __future__ import annotations

import asyncio
import json
import time

import httpx
import pytest

from tests.conftest import arun

pytestmark = pytest.mark.integration


def body(data, *, name="INPUT0", datatype="FP32", shape=None, **parameters) -> dict:
    doc = {"inputs": [{"name": name, "datatype": datatype,
                       "shape": [len(data)] if shape is None else shape, "data": data}]}
    if parameters:
        doc["parameters"] = parameters
    return doc


@pytest.fixture
def http(front_url):  # through Serve's proxy, and the fast path
    with httpx.Client(base_url=front_url, timeout=30) as client:
        yield client


def error_of(response: httpx.Response, status: int) -> str:
    assert response.status_code == status, (response.status_code, response.text)
    assert response.headers["content-type"].startswith("application/json")
    doc = response.json()
    assert set(doc) == {"error"} and isinstance(doc["error"], str), doc
    return doc["error"]


def test_a_good_request_gets_200(http):
    r = http.post("/v2/models/square/infer", json=body([2.0, 3.0]))
    assert r.status_code == 200, r.text
    assert r.json()["outputs"][0]["data"] == [4.0, 9.0]


def test_malformed_json_is_400(http):
    r = http.post("/v2/models/square/infer", content=b'{"inputs": [{"name": "INPUT0",',
                  headers={"content-type": "application/json"})
    assert "not valid JSON" in error_of(r, 400)


@pytest.mark.parametrize(("doc", "says"), [
    (body([1, 2], datatype="INT32"),
     "inference input 'INPUT0' data-type is 'INT32', but model 'square' expects 'FP32'"),
    (body([1.0, 2.0], shape=[2, 1]), "unexpected shape for input 'INPUT0' for model 'square'. "
     "Expected [-1], got [2,1]: rank 2 but the model expects rank 1"),
    (body([1.0, 2.0, 3.0], shape=[2]), "'data' holds 3 elements but shape [2] needs 2"),
    (body([1.0], name="INPUT9"), "unexpected inference input 'INPUT9' for model 'square'"),
    ({"inputs": []}, "non-empty 'inputs' array"),
], ids=["datatype", "rank", "data-vs-shape", "input-name", "no-inputs"])
def test_wrong_inputs_are_400(http, doc, says):
    r = http.post("/v2/models/square/infer", json=doc)
    assert says in error_of(r, 400)


def test_an_empty_batch_is_400(http):
    r = http.post("/v2/models/square/infer", json=body([], shape=[0]))
    assert "send at least one item" in error_of(r, 400)


def test_an_unknown_model_is_404(http):
    r = http.post("/v2/models/nope/infer", json=body([1.0]))
    unknown = "Request for unknown model: 'nope' is not found"
    assert error_of(r, 404).startswith(unknown)
    assert error_of(http.get("/v2/models/nope"), 404).startswith(unknown)
    assert error_of(http.get("/v2/models/nope/config"), 404).startswith(unknown)


def test_a_body_over_the_limit_is_413(app, http):
    limit = app.config.ingress.max_body_bytes
    data = [0.5] * (limit // 4)  # well over `limit` bytes as JSON text
    raw = json.dumps(body(data)).encode()
    assert len(raw) > limit
    r = http.post("/v2/models/square/infer", content=raw,
                  headers={"content-type": "application/json"})
    message = error_of(r, 413)
    assert f"limit of {limit}" in message and str(len(raw)) in message


@pytest.mark.parametrize(("parameters", "says"), [
    ({"priority": 5}, "priority=5 is out of range"),
    ({"priority": -1}, "parameter 'priority' must be a non-negative integer"),
    ({"timeout": "soon"}, "parameter 'timeout' must be a non-negative integer in microseconds"),
], ids=["priority-too-high", "priority-negative", "timeout-not-a-number"])
def test_bad_parameters_are_400(http, parameters, says):
    r = http.post("/v2/models/square/infer", json=body([1.0], **parameters))
    assert says in error_of(r, 400)


async def wait_for_state(app, model: str, **want: int) -> None:
    """Poll the batcher until its stats show `want` (e.g. queued_requests=2); fail after
    60 s (a hang guard, not a speed bound)."""
    give_up = time.monotonic() + 60
    while True:
        s = await app.astats(model)
        if all(s[k] == v for k, v in want.items()):
            return
        if time.monotonic() > give_up:
            raise AssertionError(f"{model} never reached {want}: {s}")
        await asyncio.sleep(0.01)


def test_a_full_queue_is_429_with_retry_after(app, gate, front_url):
    url = f"{front_url}/v2/models/gated/infer"

    async def main():
        async with httpx.AsyncClient(timeout=60) as client:
            def send(x):
                return asyncio.ensure_future(client.post(url, json=body([x])))

            gate.close()
            running = send(1.0)
            await wait_for_state(app, "gated", inflight_batches=1)
            queued = [send(2.0), send(3.0)]
            await wait_for_state(app, "gated", queued_requests=2)
            rejected = await client.post(url, json=body([4.0]))
            gate.open()
            done = await asyncio.gather(running, *queued)
            return rejected, done

    rejected, done = arun(main())
    assert "max_queue_size=2" in error_of(rejected, 429)
    assert rejected.headers["retry-after"] == "1"
    assert [r.status_code for r in done] == [200, 200, 200]
    assert [r.json()["outputs"][0]["data"] for r in done] == [[2.0], [3.0], [4.0]]


def test_a_timeout_that_expires_in_the_queue_is_504(app, gate, front_url):
    url = f"{front_url}/v2/models/gated/infer"

    async def main():
        async with httpx.AsyncClient(timeout=60) as client:
            gate.close()
            running = asyncio.ensure_future(client.post(url, json=body([1.0])))
            await wait_for_state(app, "gated", inflight_batches=1)
            # 1 s: far more than reaching the queue takes on a busy machine (a request whose
            # timeout passes on its way is refused before the queue, 429), then it passes
            # while the request waits behind the held batch
            late = asyncio.ensure_future(client.post(url, json=body([2.0], timeout=1_000_000)))
            # queued, or already ended: the engine takes an expired request out of its queue
            # at its deadline, which a stats poll on a loaded machine can miss
            give_up = time.monotonic() + 60
            while not late.done() and (await app.astats("gated"))["queued_requests"] != 1:
                assert time.monotonic() < give_up, "the request never reached the queue"
                await asyncio.sleep(0.01)
            # its deadline is 1 s after the ingress received it, which was before it was
            # seen queued (on a loaded machine, maybe well after it was sent): the gate
            # opens half a second past that at the earliest
            if not late.done():
                await asyncio.sleep(1.5)
            gate.open()
            return await late, await running

    before = app.stats("gated")
    late, running = arun(main())
    assert "passed its deadline before it could run" in error_of(late, 504)
    assert running.status_code == 200
    after = app.stats("gated")
    assert after["items"] - before["items"] == 1  # the expired request never reached the model
