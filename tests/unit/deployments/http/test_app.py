"""`OipApp` in-process over a fake backend: the routes, the error shape, the limits,
the in-flight bound and the drain, the counts, SSE with hang-ups."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import tritonclient.http as httpclient

from deployments.http import OipApp
from deployments.protocol import INFER_HEADER_LENGTH
from tests.conftest import arun as run
from tests.unit.deployments.http.fakes import (
    FOREVER,
    NEVER_ENDS,
    FakeBackend,
    call,
    infer_body,
    make_app,
)
from tests.unit.deployments.protocol.oip_cases import decode, triton_body

INFER = "/v2/models/square/infer"


def test_json_infer_round_trip():
    app, _ = make_app()
    r = run(call(app, "POST", INFER, infer_body([1.5, -2.0], id="r7")))
    assert r.status == 200 and r.headers["content-type"] == "application/json"
    assert r.json() == {"model_name": "square", "model_version": "1", "id": "r7", "outputs": [
        {"name": "OUTPUT0", "datatype": "FP32", "shape": [2], "data": [2.25, 4.0]}]}
    assert "connection" not in r.headers  # the body was read: the connection stays open


@pytest.mark.parametrize("direct", [False, True])
def test_binary_tensors_both_ways_as_tritonclient_sends_and_reads_them(direct):
    app, _ = make_app()
    x = np.arange(40_000, dtype=np.float32)  # 160 KB out: over the zero-copy threshold
    body, headers = triton_body({"INPUT0": x})
    r = run(call(app, "POST", INFER, body, headers.items(), direct=direct))
    assert r.status == 200 and r.headers["content-type"] == "application/octet-stream"
    got = decode(r.body, {INFER_HEADER_LENGTH: r.headers[INFER_HEADER_LENGTH.lower()]})
    np.testing.assert_array_equal(got.as_numpy("OUTPUT0"), x * x)
    # the fast path writes the tensor as a view of its array, not joined into a copy
    assert len(r.pieces) == (2 if direct else 1)


def test_an_output_json_cannot_carry_is_refused_with_the_fix():
    app, _ = make_app()
    x = np.array([[np.nan, 1.0]], np.float64)
    path = "/v2/models/echo/infer"
    body, headers = triton_body({"INPUT0": x})
    r = run(call(app, "POST", path, body, headers.items()))
    assert r.status == 200  # tritonclient asks for binary outputs: NaN travels fine
    as_json = [httpclient.InferRequestedOutput("OUTPUT0", binary_data=False)]
    body, headers = triton_body({"INPUT0": x}, outputs=as_json)
    r = run(call(app, "POST", path, body, headers.items()))
    assert r.status == 400 and "NaN or Infinity" in r.error() and "binary_data=true" in r.error()


@pytest.mark.parametrize(("method", "path", "status", "words"), [
    ("POST", "/v2/models/nope/infer", 404, "Request for unknown model: 'nope' is not found"),
    ("GET", "/v2/models/nope/config", 404, "Request for unknown model: 'nope' is not found"),
    ("GET", "/v2/models/square/versions/9", 404,
     "Request for unknown model: 'square' version 9 is not found"),
    ("GET", INFER, 405, "GET is not allowed"),
    ("DELETE", INFER, 405, "DELETE is not allowed"),
    ("GET", "/v2/models//infer", 404, "no route"),
    ("POST", "/v2/models/..%2f..%2fetc/infer", 404, "no route"),
    ("POST", "/v2/models/../../etc/infer", 404, "no route"),
    ("GET", "/metrics", 404, "no route"),
])
def test_routing_errors_have_the_protocols_shape(method, path, status, words):
    app, _ = make_app()
    r = run(call(app, method, path, infer_body([1.0]) if method == "POST" else b""))
    assert r.status == status and words in r.error()
    if status == 405:
        assert r.headers["allow"] == "POST"
    if method == "POST":  # answered before reading the body: the rest must not be read
        assert r.headers["connection"] == "close"


def test_too_many_headers_or_header_bytes_are_431():
    app, _ = make_app(max_header_count=10, max_header_bytes=2048)
    many = [(f"x-h{i}", "v") for i in range(11)]
    r = run(call(app, "GET", "/v2/health/live", b"", many))
    assert r.status == 431 and "11 headers" in r.error()
    big = [("x-big", "v" * 3000)]
    r = run(call(app, "GET", "/v2/health/live", b"", big))
    assert r.status == 431 and "limit of 2048" in r.error()


def test_a_body_over_the_limit_is_413_and_the_connection_closes():
    app, _ = make_app(max_body_bytes=4096)
    r = run(call(app, "POST", INFER, infer_body([0.5] * 2000)))
    assert r.status == 413 and "limit of 4096" in r.error()
    assert r.headers["connection"] == "close"
    r = run(call(app, "POST", INFER, NEVER_ENDS))  # chunked, forever: refused at 4 KiB
    assert r.status == 413 and r.headers["connection"] == "close"


def test_a_stalled_body_is_408():
    app, _ = make_app(body_timeout_s=0.05)
    r = run(call(app, "POST", INFER, [b'{"inputs": [', FOREVER]))
    assert r.status == 408 and "stalled" in r.error()
    assert r.headers["connection"] == "close"


def test_too_many_items_or_elements_are_413_from_the_shape_alone():
    app, _ = make_app(max_items_per_request=4, max_elements_per_request=100)
    r = run(call(app, "POST", INFER, infer_body([1.0] * 5)))
    assert r.status == 413 and "carries 5 items" in r.error()
    doc = b'{"inputs": [{"name": "INPUT0", "datatype": "FP64", "shape": [2, 2000000000000],' \
          b' "parameters": {"binary_data_size": 8}}]}'
    app, _ = make_app(max_elements_per_request=100)
    r = run(call(app, "POST", "/v2/models/echo/infer", doc + b"x" * 8,
                 [(INFER_HEADER_LENGTH, str(len(doc)))]))
    assert r.status == 400 and "dim 1 must be 2" in r.error()  # the model's fixed dim first
    doc = doc.replace(b"[2, 2000000000000]", b"[2000000000000, 2]")
    app, _ = make_app(max_items_per_request=10**15, max_elements_per_request=100)
    r = run(call(app, "POST", "/v2/models/echo/infer", doc + b"x" * 8,
                 [(INFER_HEADER_LENGTH, str(len(doc)))]))
    assert r.status == 413 and "4000000000000 elements" in r.error()


def test_past_the_in_flight_bound_it_is_503_with_retry_after():
    async def main():
        app, backend = make_app(max_inflight_requests=2)
        backend.step.clear()  # infer waits
        held = [asyncio.ensure_future(call(app, "POST", INFER, infer_body([1.0])))
                for _ in range(2)]
        while app.inflight < 2:
            await asyncio.sleep(0)
        refused = await call(app, "POST", INFER, infer_body([2.0]))
        backend.step.set()
        return refused, await asyncio.gather(*held), app

    refused, held, app = run(main())
    assert refused.status == 503 and "max_inflight_requests" in refused.error()
    assert refused.headers["retry-after"] == "1"
    assert [r.status for r in held] == [200, 200] and app.inflight == 0


def test_draining_refuses_new_requests_and_waits_for_the_ones_in_flight():
    async def main():
        app, backend = make_app()
        backend.step.clear()
        held = asyncio.ensure_future(call(app, "POST", INFER, infer_body([3.0])))
        while app.inflight < 1:
            await asyncio.sleep(0)
        app.begin_drain()
        refused = await call(app, "GET", "/v2/health/ready")
        assert not await app.wait_idle(0.01)
        backend.step.set()
        assert await app.wait_idle(5)
        return refused, await held

    refused, held = run(main())
    assert refused.status == 503 and "shutting down" in refused.error()
    assert refused.headers["connection"] == "close" and refused.headers["retry-after"] == "1"
    assert held.status == 200 and held.json()["outputs"][0]["data"] == [9.0]


def test_responses_are_counted_by_route_template_and_status():
    app, _ = make_app()

    async def main():
        await call(app, "POST", INFER, infer_body([1.0]))
        await call(app, "POST", INFER, infer_body([1.0]))
        await call(app, "POST", "/v2/models/square/versions/1/infer", b"{")
        await call(app, "PUT", INFER)
        await call(app, "GET", "/nope")

    run(main())
    assert app.response_counts() == {
        ("/v2/models/{model}/infer", 200): 2,
        ("/v2/models/{model}/versions/{version}/infer", 400): 1,
        ("/v2/models/{model}/infer", 405): 1,
        ("unmatched", 404): 1,
    }


def test_readiness_and_health():
    app, backend = make_app()
    assert run(call(app, "GET", "/v2/health/live")).status == 200
    assert run(call(app, "GET", "/v2/health/ready")).status == 200
    backend.not_ready.add("echo")
    r = run(call(app, "GET", "/v2/health/ready"))
    assert r.status == 503 and "['echo'] are not ready" in r.error()
    assert run(call(app, "GET", "/v2/models/echo/ready")).status == 503
    assert run(call(app, "GET", "/v2/models/square/ready")).status == 200


def test_lifespan_startup_and_shutdown_which_drains():
    app, _ = make_app()
    sent = []
    messages = iter([{"type": "lifespan.startup"}, {"type": "lifespan.shutdown"}])

    async def receive():
        return next(messages)

    async def send(message):
        sent.append(message["type"])

    run(app({"type": "lifespan"}, receive, send))
    assert sent == ["lifespan.startup.complete", "lifespan.shutdown.complete"]
    assert app.draining


def test_a_model_error_is_500_without_internals():
    app, backend = make_app()
    backend.fail_with = KeyError("/srv/internal/state")
    r = run(call(app, "POST", INFER, infer_body([1.0])))
    assert r.status == 500 and "/srv" not in r.error() and "KeyError" in r.error()


def test_server_metadata_says_the_name_and_extensions_it_was_given():
    app, _ = make_app()
    assert run(call(app, "GET", "/v2")).json()["name"] == "raybatch"
    named = OipApp(FakeBackend(), name="triton", extensions=("statistics", "sequence"))
    body = run(call(named, "GET", "/v2")).json()
    assert (body["name"], body["extensions"]) == ("triton", ["statistics", "sequence"])


def test_the_repository_index_lists_every_model_and_filters_the_ready_ones():
    app, backend = make_app()
    backend.not_ready.add("echo")
    index = "/v2/repository/index"
    every = run(call(app, "POST", index, b"")).json()  # tritonclient sends no body
    assert every == [{"name": "square", "version": "1", "state": "READY"},
                     {"name": "echo", "version": "1", "state": "UNAVAILABLE"},
                     {"name": "words", "version": "1", "state": "READY"}]
    assert run(call(app, "POST", index, b'{"ready": false}')).json() == every
    ready = run(call(app, "POST", index, b'{"ready": true}')).json()
    assert [m["name"] for m in ready] == ["square", "words"]


@pytest.mark.parametrize(("body", "words"), [
    (b"[1]", "is empty or {\"ready\": true|false}"),
    (b'{"ready": 1}', "'ready' must be true or false, got 1"),
    (b'{"ready": true, "x": 1}', "is empty or"),
    (b"{", "is empty or"),
])
def test_a_bad_repository_index_body_is_a_400_saying_what_it_takes(body, words):
    app, _ = make_app()
    r = run(call(app, "POST", "/v2/repository/index", body))
    assert r.status == 400 and words in r.error()
