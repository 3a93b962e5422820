"""The OpenAI API with the clients its users have: the `openai` package (sync and async,
streamed and not) and `curl -N`, against the shared app's generative models on every HTTP
front; the same tokens as OIP generate for the same prompt, parameters and seed; clear
refusals; a client that leaves ends its generation, and one that leaves while queued is
never run."""

from __future__ import annotations

import asyncio
import json
import subprocess

import aiohttp
import openai
import pytest

from tests.conftest import arun, wait_until

pytestmark = pytest.mark.e2e
SAMPLED = {"temperature": 0.8, "top_p": 0.9, "seed": 1234}


def client(base: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=f"{base}/v1", api_key="unused", max_retries=0, timeout=120)


def generate(base: str, model: str, prompt: str, **params) -> dict:
    async def main():
        async with aiohttp.ClientSession() as s:
            body = {"text_input": prompt, "parameters": params}
            async with s.post(f"{base}/v2/models/{model}/generate", json=body) as r:
                assert r.status == 200, await r.text()
                return await r.json()

    return arun(main(), 120)


@pytest.mark.parametrize("model", ["tinylm", "tinylm-local"])
def test_completions_give_the_tokens_generate_gives_for_the_same_seed(app, front_url, model):
    c = client(front_url)
    got = c.completions.create(model=model, prompt="Once upon a time", max_tokens=24,
                               **SAMPLED)
    want = generate(front_url, model, "Once upon a time", max_tokens=24, **SAMPLED)
    assert got.choices[0].text == want["text_output"]
    assert got.usage.completion_tokens == want["num_tokens"]
    assert got.usage.prompt_tokens == want["prompt_tokens"] == len("Once upon a time")
    assert got.choices[0].finish_reason == ("length" if want["finish_reason"] == "length"
                                            else "stop")
    greedy = c.completions.create(model=model, prompt="The ", max_tokens=12, temperature=0)
    assert greedy.choices[0].text == generate(front_url, model, "The ", max_tokens=12)[
        "text_output"]
    other = c.completions.create(model=model, prompt="Once upon a time", max_tokens=24,
                                 temperature=0.8, top_p=0.9, seed=99)
    assert other.id != got.id


def test_a_streamed_chat_gives_the_tokens_of_its_rendered_prompt(app, front_url):
    c = client(front_url)
    messages = [{"role": "system", "content": "You tell stories."},
                {"role": "user", "content": "A tale, please."}]
    stream = c.chat.completions.create(model="tinylm", messages=messages, max_tokens=30,
                                       stream=True, stream_options={"include_usage": True},
                                       **SAMPLED)
    chunks = list(stream)
    assert chunks[0].choices[0].delta.role == "assistant"
    text = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
    prompt = "system: You tell stories.\nuser: A tale, please.\nassistant:"
    want = generate(front_url, "tinylm", prompt, max_tokens=30, stop=["\nuser:"], **SAMPLED)
    assert text == want["text_output"]
    assert chunks[-1].usage.completion_tokens == want["num_tokens"]
    assert [ch.choices[0].finish_reason for ch in chunks if ch.choices][-1] in ("stop",
                                                                                 "length")
    whole = c.chat.completions.create(model="tinylm", messages=messages, max_tokens=30,
                                      **SAMPLED)
    assert whole.choices[0].message.content == text
    assert whole.choices[0].message.role == "assistant"


def test_the_async_client_streams_and_answers(app):
    async def main():
        c = openai.AsyncOpenAI(base_url=f"{app.native_url}/v1", api_key="unused",
                               max_retries=0)
        stream = await c.completions.create(model="tinylm", prompt="Ray ", max_tokens=10,
                                            stream=True, temperature=0)
        pieces = [ch.choices[0].text async for ch in stream]
        whole = await c.completions.create(model="tinylm", prompt="Ray ", max_tokens=10,
                                           temperature=0)
        listed = [m.id async for m in c.models.list()]
        await c.close()
        return pieces, whole, listed

    pieces, whole, listed = arun(main(), 120)
    assert "".join(pieces) == whole.choices[0].text and len(pieces) > 1
    assert {"tinylm", "tinylm-local"} <= set(listed) and "square" not in listed


def test_curl_streams_server_sent_events_to_done(app):
    body = json.dumps({"model": "tinylm", "prompt": "Hello", "max_tokens": 8, "stream": True,
                       "temperature": 0})
    out = subprocess.run(["curl", "-sS", "-N", "-H", "content-type: application/json",
                          "-d", body, f"{app.native_url}/v1/completions"],
                         capture_output=True, text=True, timeout=120, check=True).stdout
    events = [e for e in out.split("\n\n") if e]
    assert events[-1] == "data: [DONE]" and all(e.startswith("data: ") for e in events)
    text = "".join(json.loads(e[6:])["choices"][0]["text"] for e in events[:-1])
    assert text == generate(app.native_url, "tinylm", "Hello", max_tokens=8)["text_output"]


@pytest.mark.parametrize("call, error, code", [
    (lambda c: c.completions.create(model="nope", prompt="x"), openai.NotFoundError,
     "model_not_found"),
    (lambda c: c.completions.create(model="square", prompt="x"), openai.BadRequestError,
     "model_not_generative"),
    (lambda c: c.completions.create(model="tinylm", prompt="x", n=2), openai.BadRequestError,
     "unsupported_value"),
    (lambda c: c.completions.create(model="tinylm", prompt="x", max_tokens=-5),
     openai.BadRequestError, "invalid_value"),
    (lambda c: c.chat.completions.create(model="tinylm", messages=[{"role": "user"}]),
     openai.BadRequestError, "invalid_value"),
    (lambda c: c.completions.create(model="tinylm", prompt="x", max_tokens=10**6),
     openai.BadRequestError, None),
])
def test_refusals_reach_the_client_as_openais_errors(app, front_url, call, error, code):
    with pytest.raises(error) as e:
        call(client(front_url))
    assert e.value.code == code and e.value.body["message"]


def test_bad_json_is_a_400_in_openai_shape(app):
    async def main():
        async with aiohttp.ClientSession() as s, s.post(
                f"{app.native_url}/v1/chat/completions", data=b"{oops",
                headers={"content-type": "application/json"}) as r:
            return r.status, await r.json()

    status, doc = arun(main(), 30)
    assert status == 400 and doc["error"]["code"] == "invalid_json"


def _idle(app, model: str):
    return wait_until(lambda: (lambda s: s if s["active"] == 0 and s["waiting"] == 0
                               else None)(app.stats(model)), timeout_s=60,
                      what=f"{model} to have nothing active or waiting")


def test_a_stream_closed_by_its_client_leaves_the_batch(app, front_url):
    before = _idle(app, "tinylm")
    c = client(front_url)  # greedy, this prompt runs to its max_tokens (test_generate.py)
    stream = c.completions.create(model="tinylm", prompt="Going on and on ", max_tokens=2000,
                                  stream=True, temperature=0)
    for seen, _ in enumerate(stream, 1):
        if seen == 3:
            break
    stream.close()  # the client hangs up
    after = _idle(app, "tinylm")
    assert after["cancelled"] == before["cancelled"] + 1
    assert after["step_tokens"] - before["step_tokens"] < 1000  # it did not run to the end


def test_a_queued_stream_whose_client_leaves_never_reaches_the_model(app):
    """Fill tinylm's 16 slots with streams from one address (127.0.0.2: the per-client
    stream limit is 16), queue a 17th from another, drop it while it waits: the model
    never prefills it (16 joins, not 17), and it is counted cancelled."""
    before = _idle(app, "tinylm")
    body = {"model": "tinylm", "prompt": "Going on and on ", "max_tokens": 1900,
            "stream": True, "temperature": 0}

    async def main():
        filler = aiohttp.TCPConnector(local_addr=("127.0.0.2", 0), limit=0)
        async with aiohttp.ClientSession(connector=filler) as fill, \
                aiohttp.ClientSession() as late:
            streams = [await fill.post(f"{app.native_url}/v1/completions", json=body)
                       for _ in range(16)]
            assert all(r.status == 200 for r in streams)
            queued = asyncio.ensure_future(late.post(f"{app.native_url}/v1/completions",
                                                     json=body))
            await asyncio.to_thread(wait_until, lambda: app.stats("tinylm")["waiting"] == 1,
                                    60, 0.1, "the 17th stream to wait")
            queued.cancel()  # the client leaves while its request waits in the queue
            await asyncio.gather(queued, return_exceptions=True)
            await asyncio.to_thread(wait_until, lambda: app.stats("tinylm")["waiting"] == 0,
                                    60, 0.1, "the queued stream to be dropped")
            joined = (await app.astats("tinylm"))["joins"]
            for r in streams:
                r.close()
            return joined

    joined = arun(main(), 180)
    after = _idle(app, "tinylm")
    assert joined - before["joins"] == 16
    assert after["joins"] - before["joins"] == 16  # the dropped one never started
    assert after["cancelled"] - before["cancelled"] == 17


def test_a_thousand_streams_opened_and_dropped_leave_nothing_running(app):
    before = _idle(app, "tinylm")
    body = {"model": "tinylm", "messages": [{"role": "user", "content": "Hi"}],
            "max_tokens": 500, "stream": True, "temperature": 0.7}

    async def one(s, i: int) -> int:
        async with s.post(f"{app.native_url}/v1/chat/completions", json=body) as r:
            if r.status != 200:
                return r.status
            if i % 2:  # half leave after their first chunk, half before reading any
                await r.content.readline()
            return 200

    async def main():
        # Under the per-client limit of 16 streams; a stream's slot frees only once the
        # server sees its client gone, so a few may still meet the limit (a clear 429).
        gate = asyncio.Semaphore(8)
        async with aiohttp.ClientSession() as s:
            async def bounded(i):
                async with gate:
                    return await one(s, i)
            return await asyncio.gather(*(bounded(i) for i in range(1000)))

    statuses = arun(main(), 600)
    assert set(statuses) <= {200, 429} and statuses.count(200) >= 500
    after = _idle(app, "tinylm")  # nothing left running or waiting
    ended = after["cancelled"] + sum(after["finished"].values()) - before["cancelled"] - sum(
        before["finished"].values())
    assert ended == statuses.count(200)  # each accepted stream ended once
    c = client(app.native_url)  # and the model still answers
    assert c.completions.create(model="tinylm", prompt="x", max_tokens=3).choices[0].text
