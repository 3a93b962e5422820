"""Triton's `ModelStreamInfer` with `tritonclient.grpc`, unchanged, against the shared app
through Serve's gRPC proxy (the hang-ups: on the replica's own port, see their tests):
`start_stream` / `async_stream_infer` / `stop_stream` (and the aio client's
`stream_infer`) as generation clients of Triton's vLLM and TensorRT-LLM backends use them,
the HTTP generate route's twin; a stateless model's one response per request; errors that
leave the stream usable; and a hang-up that ends the generation.
"""

from __future__ import annotations

import asyncio
import json
import queue
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.grpc.aio as aioclient

from tests.conftest import arun, wait_until

pytestmark = pytest.mark.e2e
FINAL = "triton_final_response"
WAIT_S = 60.0  # a bound on waiting for a response; nothing asserts how long it took


class Stream:
    """One stream of a sync client; every callback's (result, error), in order."""

    def __init__(self, app, port: int | None = None) -> None:
        """`port`: Serve's gRPC proxy unless another (the replica's own) is given."""
        self.client = grpcclient.InferenceServerClient(f"127.0.0.1:{port or app.grpc_port}")
        self.got: queue.Queue = queue.Queue()
        self.client.start_stream(lambda result, error: self.got.put((result, error)),
                                 headers={"application": app.name})

    def send(self, model: str, inputs: list, **kwargs) -> None:
        self.client.async_stream_infer(model, inputs, **kwargs)

    def next(self):
        return self.got.get(timeout=WAIT_S)

    def until_final(self, *request_ids: str) -> list:
        """Responses until each of `request_ids` had its final one."""
        seen, ended = [], set()
        while ended != set(request_ids):
            result, error = self.next()
            assert error is None, error
            seen.append(result)
            if final(result):
                ended.add(result.get_response().id)
        return seen

    def stop(self, cancel_requests: bool = False) -> list:
        self.client.stop_stream(cancel_requests=cancel_requests)
        self.client.close()
        rest = []
        while not self.got.empty():
            rest.append(self.got.get_nowait())
        return rest


def final(result) -> bool:
    return result.get_response().parameters[FINAL].bool_param


def text_of(result) -> str:
    out = result.as_numpy("text_output")
    return "" if out is None else out.ravel()[0].decode()


def prompt(text: str) -> list:
    t = grpcclient.InferInput("text_input", [1], "BYTES")
    t.set_data_from_numpy(np.array([text.encode()], dtype=object))
    return [t]


def http_generate(app, text: str, max_tokens: int, **parameters) -> dict:
    body = json.dumps({"text_input": text,
                       "parameters": {"max_tokens": max_tokens, **parameters}})
    req = urllib.request.Request(f"{app.base_url}/v2/models/tinylm/generate",
                                 data=body.encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=WAIT_S) as r:
        return json.loads(r.read())


def test_a_stream_gives_token_for_token_the_http_generate_text(app):
    whole = http_generate(app, "Once upon a time", 12)
    assert whole["finish_reason"] == "length"  # so every step released text
    s = Stream(app)
    try:
        s.send("tinylm", prompt("Once upon a time"), request_id="g1",
               parameters={"max_tokens": 12})
        got = s.until_final("g1")
    finally:
        s.stop()
    assert "".join(text_of(r) for r in got) == whole["text_output"]
    assert len(got) == whole["num_tokens"]  # one response per step
    assert [final(r) for r in got] == [False] * (len(got) - 1) + [True]
    assert text_of(got[-1]) != ""  # the flag rides on the last step's text
    last = got[-1].get_response()
    assert last.model_name == "tinylm"
    assert last.parameters["finish_reason"].string_param == whole["finish_reason"]
    assert last.parameters["num_tokens"].int64_param == whole["num_tokens"]


def test_sampling_parameters_as_request_parameters_or_input_tensors_give_the_http_tokens(app):
    sampling = {"temperature": 0.5, "top_p": 0.75, "seed": 7}  # exact in FP32 too
    whole = http_generate(app, "Once upon a time", 10, **sampling)
    tensors = prompt("Once upon a time")
    for name, value, datatype in [("max_tokens", np.array([10], np.int32), "INT32"),
                                  ("temperature", np.array([0.5], np.float32), "FP32"),
                                  ("top_p", np.array([0.75], np.float32), "FP32"),
                                  ("seed", np.array([7], np.int64), "INT64")]:
        t = grpcclient.InferInput(name, [1], datatype)
        t.set_data_from_numpy(value)
        tensors.append(t)
    s = Stream(app)
    try:
        s.send("tinylm", prompt("Once upon a time"), request_id="params",
               parameters={"max_tokens": 10, **sampling})
        s.send("tinylm", tensors, request_id="tensors")
        got = s.until_final("params", "tensors")
    finally:
        s.stop()
    for i in ("params", "tensors"):
        mine = [r for r in got if r.get_response().id == i]
        assert "".join(text_of(r) for r in mine) == whole["text_output"], i


def test_concurrent_requests_on_one_stream_each_get_their_own_text(app):
    prompts = {"a": ("Once upon a time", 9), "b": ("The quick brown fox", 5),
               "c": ("Hello", 14), "d": ("In the beginning", 7)}
    alone = {i: http_generate(app, p, n)["text_output"] for i, (p, n) in prompts.items()}
    s = Stream(app)
    try:
        for i, (p, n) in prompts.items():
            s.send("tinylm", prompt(p), request_id=i, parameters={"max_tokens": n})
        results = s.until_final(*prompts)
    finally:
        rest = s.stop()
    assert rest == []
    for i in prompts:
        mine = [r for r in results if r.get_response().id == i]
        assert "".join(text_of(r) for r in mine) == alone[i]
        assert [final(r) for r in mine] == [False] * (len(mine) - 1) + [True]


def test_an_empty_final_response_ends_the_generation_when_asked_for(app):
    s = Stream(app)
    try:
        s.send("tinylm", prompt("Once upon a time"), request_id="e1",
               parameters={"max_tokens": 4}, enable_empty_final_response=True)
        got = s.until_final("e1")
    finally:
        s.stop()
    assert len(got) == 5 and [final(r) for r in got] == [False] * 4 + [True]
    assert got[-1].as_numpy("text_output") is None  # Triton's empty response
    assert got[-1].get_response().parameters["finish_reason"].string_param == "length"
    assert all(text_of(r) for r in got[:-1])


def test_a_stateless_model_answers_each_request_once(app):
    xs = {f"s{i}": np.arange(1, i + 2, dtype=np.float32) for i in range(5)}
    s = Stream(app)
    for i, x in xs.items():
        t = grpcclient.InferInput("INPUT0", list(x.shape), "FP32")
        t.set_data_from_numpy(x)
        s.send("square", [t], request_id=i)
    rest = s.stop()  # a half-close: what was sent is answered first
    assert len(rest) == len(xs) and all(error is None for _, error in rest)
    by_id = {r.get_response().id: r for r, _ in rest}
    for i, x in xs.items():
        np.testing.assert_array_equal(by_id[i].as_numpy("OUTPUT0"), x * x)
        assert final(by_id[i])


def test_stop_stream_answers_what_runs_before_the_stream_ends(app):
    s = Stream(app)
    s.send("tinylm", prompt("Once upon a time"), request_id="late",
           parameters={"max_tokens": 8})
    rest = s.stop()  # a half-close at once: the generation still runs to its end
    assert all(error is None for _, error in rest)
    assert len(rest) == 8 and [final(r) for r, _ in rest] == [False] * 7 + [True]


@pytest.mark.parametrize("model, inputs, parameters, words", [
    ("tinylm", lambda: [], {"max_tokens": 3}, "no input 'text_input'"),
    ("nope", lambda: prompt("hi"), {}, "Request for unknown model: 'nope' is not found"),
    ("tinylm", lambda: prompt("hi"), {"max_tokens": -1}, "max_tokens=-1 is out of range"),
    ("tinylm", lambda: prompt("hi"), {"max_tokens": "three"}, "'max_tokens' must be an integer"),
    ("tinylm", lambda: prompt("hi"), {"stop": 5}, "'stop' must be a non-empty string"),
])
def test_a_bad_request_gets_an_error_response_and_the_stream_goes_on(
        app, model, inputs, parameters, words):
    s = Stream(app)
    try:
        s.send(model, inputs(), request_id="bad", parameters=parameters)
        result, error = s.next()
        assert result is None and words in error.message()
        s.send("tinylm", prompt("Once upon a time"), request_id="good",
               parameters={"max_tokens": 3})
        got = s.until_final("good")
    finally:
        s.stop()
    assert len(got) == 3 and final(got[-1])


def stats_after_hang_up(app, before: dict, model: str = "tinylm",
                        max_tokens: int = 2000) -> dict:
    stats = wait_until(lambda: (lambda s: s if s["active"] == 0 and s["waiting"] == 0 else None)(
        app.stats(model)), timeout_s=30, what="the generation to be cancelled")
    assert stats["cancelled"] > before["cancelled"]
    # it did not run to max_tokens
    assert stats["step_tokens"] - before["step_tokens"] < max_tokens // 2
    return stats


# The hang-ups: on the ingress replica's own gRPC port (Serve's direct ingress), where the
# client's hang-up reaches the stream's handler itself. Through Serve's gRPC proxy, a
# hang-up reached the replica late or not at all in some loaded CI runs (the proxy can end
# its side, a GeneratorExit in its log, without cancelling its call to the replica), and a
# generation left running then held up the next test's wait for the model to be idle.
# tinylm-local's 8,000 tokens, as its HTTP twin asks (tinylm's 2,000 could end first); the
# batching actor's side of a cancel is the same call as for SSE (test_generate.py).
@pytest.mark.parametrize("model, max_tokens", [("tinylm-local", 8000)])
def test_stop_stream_with_cancel_requests_ends_the_generation(app, model, max_tokens):
    before = app.stats(model)
    s = Stream(app, app.direct_grpc_port)
    s.send(model, prompt("Going on and on "), request_id="long",
           parameters={"max_tokens": max_tokens})
    result, error = s.next()
    assert error is None and result.get_response().id == "long" and not final(result)
    s.stop(cancel_requests=True)
    stats_after_hang_up(app, before, model, max_tokens)


def test_a_closed_channel_ends_the_generation(app):
    """On the ingress replica's own gRPC port, as the test above (see there)."""
    async def main():
        client = aioclient.InferenceServerClient(f"127.0.0.1:{app.direct_grpc_port}")

        async def requests():  # tinylm-local's 8,000 tokens, as its HTTP twin: Serve's proxy
            # may pass a hang-up on seconds late on a loaded machine
            yield {"model_name": "tinylm-local", "inputs": prompt("Going on and on "),
                   "request_id": "long", "parameters": {"max_tokens": 8000}}
            await never.wait()  # the client sends nothing more, and never half-closes

        never = asyncio.Event()
        responses = client.stream_infer(requests(), headers={"application": app.name})
        async for result, error in responses:
            assert error is None and result.get_response().id == "long"
            break
        await client.close()  # the channel closes under the open stream

    before = app.stats("tinylm-local")
    arun(main(), WAIT_S)
    stats_after_hang_up(app, before, "tinylm-local", 8000)
