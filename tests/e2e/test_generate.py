"""Generative models over HTTP: the OIP generate extension, SSE streams, cancellation.

A real HTTP client (aiohttp) reads the server-sent events; continuous batching
must give every prompt, token for token, the text it gets alone.
"""

from __future__ import annotations

import asyncio
import json

import aiohttp
import pytest

from tests.conftest import arun, hang_up_stream, wait_until

pytestmark = pytest.mark.e2e

PROMPTS = ["The ", "Once upon a time there was", "a", "Ray batches ", "Hello, world. " * 3,
           "zz", "In the beginning ", "q"]


async def _generate(session, base: str, prompt: str, **params) -> tuple[int, dict]:
    body = {"text_input": prompt, "parameters": params}
    async with session.post(f"{base}/v2/models/tinylm/generate", json=body) as r:
        return r.status, await r.json()


async def _stream(session, base: str, prompt: str, **params) -> list[dict]:
    body = {"text_input": prompt, "parameters": params}
    async with session.post(f"{base}/v2/models/tinylm/generate_stream", json=body) as r:
        assert r.status == 200, await r.text()
        assert r.headers["content-type"].startswith("text/event-stream")
        events = []
        async for line in r.content:
            if line.startswith(b"data: "):
                events.append(json.loads(line[6:]))
        return events


def test_generate_returns_the_whole_text(app):
    async def main():
        async with aiohttp.ClientSession() as s:
            return await _generate(s, app.base_url, "Hello", max_tokens=12)

    status, body = arun(main(), 60)
    assert status == 200, body
    assert body["model_name"] == "tinylm" and body["finish_reason"] in ("length", "stop", "eos")
    assert body["num_tokens"] <= 12 and isinstance(body["text_output"], str)
    assert body["prompt_tokens"] == 5


def test_32_concurrent_prompts_equal_one_at_a_time_token_for_token(app):
    prompts = [PROMPTS[i % len(PROMPTS)] * (1 + i % 3) for i in range(32)]
    lengths = [4 + (i * 7) % 40 for i in range(32)]

    async def alone_then(together: bool):
        async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=120)) as s:
            calls = [_generate(s, app.base_url, p, max_tokens=n)
                     for p, n in zip(prompts, lengths, strict=True)]
            if together:
                return await asyncio.gather(*calls)
            return [await c for c in calls]

    alone = arun(alone_then(False), 180)
    before = app.stats("tinylm")
    together = arun(alone_then(True), 180)
    after = app.stats("tinylm")
    for (sa, a), (st, t) in zip(alone, together, strict=True):
        assert sa == st == 200
        assert t["text_output"] == a["text_output"] and t["num_tokens"] == a["num_tokens"]
    # concurrent prompts shared steps: far fewer steps than tokens
    tokens = sum(t["num_tokens"] for _, t in together)
    assert after["steps"] - before["steps"] < tokens


def test_stream_sends_one_event_per_step_then_a_final_one(front_url):
    async def main():
        async with aiohttp.ClientSession() as s:
            events = await _stream(s, front_url, "Once upon", max_tokens=10)
            whole = await _generate(s, front_url, "Once upon", max_tokens=10)
            return events, whole

    events, (_status, whole) = arun(main(), 60)
    assert events[-1]["final"] is True and events[-1]["finish_reason"] == whole["finish_reason"]
    assert all(e["model_name"] == "tinylm" for e in events)
    text = "".join(e["text_output"] for e in events[:-1])
    assert text == whole["text_output"]
    assert [e["index"] for e in events[:-1]] == sorted(e["index"] for e in events[:-1])


def test_a_client_that_disconnects_mid_stream_cancels_its_generation(app, front_url):
    async def main():
        return await hang_up_stream(front_url, "tinylm")

    before = app.stats("tinylm")
    assert arun(main(), 60) == 3
    stats = wait_until(lambda: (lambda s: s if s["active"] == 0 and s["waiting"] == 0 else None)(
        app.stats("tinylm")), timeout_s=30, what="the generation to be cancelled")
    assert stats["cancelled"] > before["cancelled"]
    assert stats["step_tokens"] - before["step_tokens"] < 1000  # it did not run to max_tokens


@pytest.mark.parametrize("body, status, words", [
    ({"parameters": {"max_tokens": 3}}, 400, "text_input"),
    ({"text_input": "a", "parameters": {"temperature": 2.5}}, 400, "temperature"),
    ({"text_input": "a", "parameters": {"seed": -1}}, 400, "seed"),
    ({"text_input": "a", "parameters": {"max_tokens": 0}}, 400, "max_tokens"),
    ({"text_input": "a", "parameters": {"max_tokens": 10**6}}, 400, "max_tokens"),
    ({"text_input": "", "parameters": {}}, 400, "prompt"),
    ({"text_input": 5}, 400, "text_input"),
])
def test_bad_generate_requests_get_a_clear_400(front_url, body, status, words):
    async def main():
        async with aiohttp.ClientSession() as s:
            for path in ("generate", "generate_stream"):
                async with s.post(f"{front_url}/v2/models/tinylm/{path}", json=body) as r:
                    assert r.status == status, (path, await r.text())
                    assert words in (await r.json())["error"]

    arun(main(), 30)


def test_generate_on_a_stateless_model_and_infer_on_a_generative_one_are_refused(app):
    infer = {"inputs": [{"name": "text_input", "datatype": "BYTES", "shape": [1],
                         "data": ["hi"]}]}

    async def main():
        async with aiohttp.ClientSession() as s:
            async with s.post(f"{app.base_url}/v2/models/square/generate",
                              json={"text_input": "hi"}) as r:
                a = r.status, await r.json()
            async with s.post(f"{app.base_url}/v2/models/tinylm/infer", json=infer) as r:
                b = r.status, await r.json()
            return a, b

    (sa, a), (sb, b) = arun(main(), 30)
    assert sa == 400 and "infer" in a["error"]
    assert sb == 400 and "generate" in b["error"]


def test_handle_streams_the_same_events(app):
    async def main():
        stream = app.handle.options(stream=True).generate_stream.remote(
            "tinylm", "Once upon", {"max_tokens": 10})
        return [e async for e in stream]

    events = arun(main(), 60)
    whole = app.handle.generate.remote("tinylm", "Once upon", {"max_tokens": 10}).result(
        timeout_s=60)
    assert events[-1]["final"] is True
    assert "".join(e["text_output"] for e in events[:-1]) == whole["text_output"]
