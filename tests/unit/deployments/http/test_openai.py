"""The OpenAI routes over the app: shapes, streams, hang-ups, errors in OpenAI's shape,
and a fixed-seed fuzz of hostile bodies (always a 4xx in OpenAI's shape, never a 5xx)."""

from __future__ import annotations

import json
import random

import pytest

from tests.conftest import arun as run
from tests.unit.deployments.http.fakes import call, make_app

COMPLETIONS, CHAT = "/v1/completions", "/v1/chat/completions"


def body(**doc) -> bytes:
    return json.dumps(doc).encode()


def sse(raw: bytes) -> list:
    chunks = raw.split(b"\n\n")
    assert chunks[-1] == b"" and all(c.startswith(b"data: ") for c in chunks[:-1]), raw
    return [c[6:] if c == b"data: [DONE]" else json.loads(c[6:]) for c in chunks[:-1]]


def openai_error(r) -> dict:
    assert r.headers["content-type"] == "application/json", r.headers
    doc = json.loads(r.body)
    assert set(doc) == {"error"} and set(doc["error"]) == {"message", "type", "param", "code"}
    return doc["error"]


def test_a_completion_is_the_generation_in_openai_shape():
    app, _ = make_app()
    r = run(call(app, "POST", COMPLETIONS, body(model="words", prompt="hi", max_tokens=2)))
    assert r.status == 200, r.body
    doc = r.json()
    assert doc["object"] == "text_completion" and doc["model"] == "words"
    assert doc["choices"][0]["text"] == "w0 w1 " and doc["choices"][0]["finish_reason"] == "length"
    assert doc["usage"] == {"prompt_tokens": 2, "completion_tokens": 2, "total_tokens": 4}


def test_a_chat_stream_sends_the_role_then_the_text_then_done():
    app, _ = make_app()
    r = run(call(app, "POST", CHAT, body(model="words", stream=True, max_tokens=3,
                                         stream_options={"include_usage": True},
                                         messages=[{"role": "user", "content": "hi"}])))
    assert r.status == 200 and r.headers["content-type"] == "text/event-stream"
    got = sse(r.body)
    assert got[-1] == b"[DONE]"
    deltas = [c["choices"][0]["delta"] for c in got[:-2]]
    assert deltas[0] == {"role": "assistant", "content": ""}
    assert "".join(d.get("content", "") for d in deltas) == "w0 w1 w2 "
    assert got[-3]["choices"][0]["finish_reason"] == "length"
    assert got[-2]["choices"] == [] and got[-2]["usage"]["completion_tokens"] == 3
    assert len({c["id"] for c in got[:-1]}) == 1 and app.streams == {}


def test_models_lists_the_generative_ones():
    app, _ = make_app()
    r = run(call(app, "GET", "/v1/models"))
    assert r.status == 200 and [m["id"] for m in r.json()["data"]] == ["words"]


def test_a_client_that_hangs_up_cancels_its_generation():
    app, backend = make_app()
    r = run(call(app, "POST", COMPLETIONS, body(model="words", prompt="long", stream=True,
                                                max_tokens=1_000_000), hang_up_after_events=2))
    assert 2 <= len(sse(r.body)) < 1000
    assert backend.closed == ["long"]
    assert app.response_counts() == {("/v1/completions", 499): 1}
    assert app.streams == {} and app.inflight == 0


@pytest.mark.parametrize("path, doc, status, code", [
    (COMPLETIONS, {"model": "nope", "prompt": "x"}, 404, "model_not_found"),
    (COMPLETIONS, {"model": "square", "prompt": "x"}, 400, "model_not_generative"),
    (COMPLETIONS, {"model": "words", "prompt": "x", "n": 2}, 400, "unsupported_value"),
    (COMPLETIONS, {"model": "words", "prompt": "x", "max_tokens": -4}, 400, "invalid_value"),
    (CHAT, {"model": "words", "messages": []}, 400, "invalid_value"),
])
def test_refusals_are_in_openai_shape(path, doc, status, code):
    app, _ = make_app()
    r = run(call(app, "POST", path, body(**doc)))
    assert r.status == status and openai_error(r)["code"] == code


def test_routing_and_limit_errors_on_v1_are_in_openai_shape_too():
    app, _ = make_app()
    r = run(call(app, "POST", "/v1/embeddings", body(model="words")))
    assert r.status == 404 and "/v1" in openai_error(r)["message"]
    r = run(call(app, "GET", COMPLETIONS))
    assert r.status == 405 and openai_error(r)["type"] == "invalid_request_error"
    r = run(call(app, "POST", COMPLETIONS, b"{not json"))
    assert r.status == 400 and openai_error(r)["code"] == "invalid_json"
    app, _ = make_app(max_body_bytes=64)
    r = run(call(app, "POST", COMPLETIONS, body(model="words", prompt="x" * 100)))
    assert r.status == 413 and openai_error(r)["type"] == "invalid_request_error"
    app.begin_drain()
    r = run(call(app, "GET", "/v1/models"))
    assert r.status == 503 and openai_error(r)["type"] == "server_error"
    assert "retry-after" in r.headers


def test_a_stream_past_the_clients_limit_is_a_429():
    app, backend = make_app(max_streams_per_client=1)
    backend.step.clear()  # the first stream holds its slot

    async def two():
        import asyncio

        first = asyncio.ensure_future(call(app, "POST", COMPLETIONS, body(
            model="words", prompt="a", stream=True, max_tokens=5)))
        while not app.streams:
            await asyncio.sleep(0)
        second = await call(app, "POST", COMPLETIONS, body(model="words", prompt="b",
                                                           stream=True))
        backend.step.set()
        return await first, second

    first, second = run(two())
    assert first.status == 200 and sse(first.body)[-1] == b"[DONE]"
    assert second.status == 429 and openai_error(second)["type"] == "rate_limit_error"


def test_an_error_after_the_first_event_is_an_openai_error_event():
    app, backend = make_app()
    backend.fail_after = 2
    r = run(call(app, "POST", COMPLETIONS, body(model="words", prompt="x", stream=True,
                                                max_tokens=5)))
    got = sse(r.body)
    assert [c["choices"][0]["text"] for c in got[:-1]] == ["w0 ", "w1 "]
    assert set(got[-1]["error"]) == {"message", "type", "param", "code"}
    assert got[-1]["error"]["type"] == "server_error" and app.streams == {}


_VALUES = [None, True, False, 0, -1, 1, 2.5, 1e308, "", "x", "\u0000", [], [1], ["a"] * 9,
           {}, {"include_usage": True}, [{"role": "user", "content": "x"}],
           [{"role": "user"}], [{"content": "x"}]]
_FIELDS = ["model", "prompt", "messages", "max_tokens", "temperature", "top_p", "n",
           "stream", "stop", "seed", "stream_options", "logprobs", "priority", "timeout",
           "max_completion_tokens", "echo", "extra"]


def test_hostile_bodies_get_a_4xx_in_openai_shape_or_an_answer_never_a_5xx():
    rng = random.Random(20261128)
    app, _ = make_app()
    statuses = set()
    for _ in range(400):
        doc = {f: rng.choice(_VALUES) for f in rng.sample(_FIELDS, rng.randint(0, 6))}
        if rng.random() < 0.7:
            doc["model"] = "words"
        path = rng.choice((COMPLETIONS, CHAT))
        raw = json.dumps(doc).encode()
        if rng.random() < 0.1:
            raw = raw[: rng.randint(0, len(raw))]
        r = run(call(app, "POST", path, raw))
        statuses.add(r.status)
        assert r.status in (200, 400, 404, 413), (doc, r.status, r.body)
        if r.status != 200:
            openai_error(r)
        elif r.headers["content-type"] == "text/event-stream":
            assert sse(r.body)[-1] == b"[DONE]"
    assert {200, 400, 404} <= statuses
    assert app.streams == {} and app.inflight == 0
