"""The Serve peers' HTTP handling (without Serve: the batched call is replaced by an echo)
and the report's context line for the peer with Serve's documented JSON."""

import asyncio
import json

import numpy as np
import pytest
from starlette.requests import Request

from benchmarks.serve import report as serve_report
from benchmarks.serve.apps import BatchedStdJson, _ServeModel
from benchmarks.serve.drivers import http_body
from benchmarks.serve.models import bench_models
from deployments.protocol import INFER_HEADER_LENGTH


class EchoStdJson(BatchedStdJson):
    """The peer's own `__call__`; `infer` answers 2x at once (no `@serve.batch` queue)."""

    def __init__(self) -> None:
        _ServeModel.__init__(self, bench_models()["mlp"].config.model_dump_json(), None)

    async def infer(self, x: np.ndarray) -> np.ndarray:  # type: ignore[override]
        return 2 * x


def _call(app: EchoStdJson, body: bytes, headers: dict[str, str]):
    async def receive() -> dict:
        return {"type": "http.request", "body": body, "more_body": False}

    scope = {"type": "http", "method": "POST", "path": "/", "query_string": b"",
             "headers": [(k.lower().encode(), v.encode()) for k, v in headers.items()]}
    return asyncio.run(app(Request(scope, receive)))


@pytest.fixture(scope="module")
def app() -> EchoStdJson:
    return EchoStdJson()


X = np.random.default_rng(0).standard_normal((1, 256), dtype=np.float32)


def test_json_goes_through_the_standard_library_and_answers_the_oip_shape(app, monkeypatch):
    from benchmarks.serve import apps as serve_apps

    def shared_codec(*a, **k):
        raise AssertionError("the documented peer must not take Raybatch's codec for JSON")

    monkeypatch.setattr(serve_apps, "parse_infer_request", shared_codec)
    body, headers = http_body(X, binary=False)
    r = _call(app, body, headers)
    assert r.status_code == 200
    out = json.loads(r.body)["outputs"][0]
    assert out["name"] == "OUTPUT0" and out["shape"] == [1, 256]
    np.testing.assert_array_equal(np.asarray(out["data"], np.float32).reshape(1, 256), 2 * X)


def test_binary_takes_the_shared_codec(app):
    body, headers = http_body(X, binary=True)
    r = _call(app, body, headers)
    assert r.status_code == 200
    size = int(r.headers[INFER_HEADER_LENGTH])
    out = json.loads(r.body[:size])["outputs"][0]
    assert out["parameters"]["binary_data_size"] == len(r.body) - size
    y = np.frombuffer(r.body[size:], dtype=np.float32).reshape(out["shape"])
    np.testing.assert_array_equal(y, 2 * X)


@pytest.mark.parametrize("body", [b"{", b'{"inputs": []}', b'{"inputs": [{"data": [1]}]}',
                                  b'{"inputs": [{"shape": [2], "data": ["a", 1]}]}'])
def test_bad_json_is_a_400(app, body):
    r = _call(app, body, {"Content-Type": "application/json"})
    assert r.status_code == 400 and "error" in json.loads(r.body)


def _result(binary: bool, stdjson: bool) -> dict:
    def r(rps: float) -> dict:
        return {"requests": 100, "throughput_rps": rps}

    http = {"serve.batch": r(3000.0), "rb:x": r(7500.0)}
    if stdjson:
        http["serve.batch.stdjson"] = r(2000.0)
    return {"settings": {"binary_http": binary},
            "models": {"mlp": {"points": [{"concurrency": 128, "ceiling_items_per_s": 1.0,
                                           "http": http}]}}}


def test_the_report_gives_the_documented_json_peer_as_context_only():
    targets = {t["name"]: t for t in serve_report.targets(_result(False, True))}
    context = next(t for n, t in targets.items() if "stdlib JSON" in n)
    assert context["value"] == pytest.approx(3.75) and context["passed"] is None
    judged = next(t for n, t in targets.items() if "(JSON)" in n)
    assert judged["value"] == pytest.approx(2.5) and judged["passed"] is False


@pytest.mark.parametrize("binary, stdjson", [(True, True), (False, False)])
def test_no_context_line_for_binary_or_without_that_peer(binary, stdjson):
    names = [t["name"] for t in serve_report.targets(_result(binary, stdjson))]
    assert names and not any("stdlib JSON" in n for n in names)
