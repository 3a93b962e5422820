"""generate and generate_stream over the app: SSE events, a hang-up that cancels the
generation, errors before and after the first event, streams per client."""

from __future__ import annotations

import asyncio
import json

from tests.conftest import arun as run
from tests.unit.deployments.http.fakes import call, make_app

STREAM = "/v2/models/words/generate_stream"


def events(body: bytes) -> list[dict]:
    chunks = body.split(b"\n\n")
    assert chunks[-1] == b"" and all(c.startswith(b"data: ") for c in chunks[:-1])
    return [json.loads(c[6:]) for c in chunks[:-1]]


def test_a_stream_is_one_event_per_step_then_the_final_one():
    app, _ = make_app()
    r = run(call(app, "POST", STREAM, b'{"id": "g1", "text_input": "hi", "max_tokens": 3}'))
    assert r.status == 200 and r.headers["content-type"] == "text/event-stream"
    got = events(r.body)
    assert [e["text_output"] for e in got] == ["w0 ", "w1 ", "w2 ", ""]
    assert got[-1]["final"] is True and all(e["id"] == "g1" for e in got)
    assert app.streams == {}  # the client's stream slot is given back


def test_generate_answers_the_whole_text():
    app, _ = make_app()
    r = run(call(app, "POST", "/v2/models/words/generate", b'{"text_input": "x", '
                                                          b'"parameters": {"max_tokens": 2}}'))
    assert r.status == 200 and r.json()["text_output"] == "w0 w1 "


def test_a_client_that_hangs_up_cancels_its_generation():
    app, backend = make_app()
    body = b'{"text_input": "long", "max_tokens": 1000000}'
    r = run(call(app, "POST", STREAM, body, hang_up_after_events=2))
    assert 2 <= len(events(r.body)) < 1000
    assert backend.closed == ["long"]  # closed before its end: cancelled
    assert app.response_counts() == {("/v2/models/{model}/generate_stream", 499): 1}
    assert app.streams == {} and app.inflight == 0


def test_errors_before_the_first_event_are_a_4xx():
    app, _ = make_app()
    r = run(call(app, "POST", STREAM, b'{"text_input": 5}'))
    assert r.status == 400 and "text_input" in r.error()
    r = run(call(app, "POST", STREAM, b'{"text_input": "a", "max_tokens": [[[1]]]}'))
    assert r.status == 400 and "flat list" in r.error()
    assert app.streams == {}


def test_an_error_after_the_first_event_is_an_error_event():
    app, backend = make_app()
    backend.fail_after = 2
    r = run(call(app, "POST", STREAM, b'{"text_input": "x", "max_tokens": 5}'))
    got = events(r.body)
    assert r.status == 200 and [e.get("text_output") for e in got[:2]] == ["w0 ", "w1 "]
    assert set(got[-1]) == {"error"} and "RuntimeError" in got[-1]["error"]


def test_streams_per_client_are_bounded_with_429():
    async def main():
        app, backend = make_app(max_streams_per_client=1)
        backend.step.clear()  # the first stream waits after its start
        body = b'{"text_input": "a", "max_tokens": 2}'
        first = asyncio.ensure_future(call(app, "POST", STREAM, body))
        while not app.streams:
            await asyncio.sleep(0)
        same = await call(app, "POST", STREAM, body)
        other = asyncio.ensure_future(call(app, "POST", STREAM, body, client="10.0.0.9"))
        backend.step.set()
        return same, await first, await other, app

    same, first, other, app = run(main())
    assert same.status == 429 and "max_streams_per_client" in same.error()
    assert same.headers["retry-after"] == "1"
    assert first.status == 200 and other.status == 200 and app.streams == {}
