"""A generate request on Triton's stream as tritonclient.grpc builds it, read into the
parameters the HTTP generate routes pass; and the responses of a generation's steps,
final flag included, as tritonclient reads them. No server, no engine."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc._utils import _get_inference_request

from batching.errors import InvalidRequest
from cluster.config import TensorConfig
from deployments.grpc.generate import (
    EMPTY_FINAL,
    FINAL,
    GenerateCall,
    StepWriter,
    error_response,
    read_generate_request,
)

OUTPUTS = {"text_output": TensorConfig(name="text_output", datatype="BYTES", shape=[-1])}


def tensor(name: str, value: np.ndarray, datatype: str) -> grpcclient.InferInput:
    t = grpcclient.InferInput(name, list(value.shape), datatype)
    t.set_data_from_numpy(value)
    return t


def prompt(text: bytes = b"Once upon", shape=(1,)) -> grpcclient.InferInput:
    return tensor("text_input", np.array([text], dtype=object).reshape(shape), "BYTES")


def request(*inputs, request_id="", parameters=None, empty_final=False, outputs=None):
    r = _get_inference_request("lm", list(inputs), model_version="", request_id=request_id,
                               outputs=outputs, sequence_id=0, sequence_start=False,
                               sequence_end=False, priority=0, timeout=None,
                               parameters=parameters)
    if empty_final:
        r.parameters[EMPTY_FINAL].bool_param = True
    return r


def reserved(r):  # tritonclient refuses to send it; a raw gRPC client may
    r.parameters["triton_whatever"].int64_param = 1
    return r


def read(r) -> GenerateCall:
    return read_generate_request(r, OUTPUTS, "lm", 1 << 20)


def test_the_prompt_and_parameters_become_the_http_generate_parameters():
    call = read(request(prompt(b"Once upon"), request_id="g1",
                        parameters={"max_tokens": 5, "stop": "\n", "top_p": 0.5}))
    assert (call.request_id, call.prompt, call.shape) == ("g1", "Once upon", (1,))
    assert call.parameters == {"max_tokens": 5, "stop": "\n", "top_p": 0.5}
    assert (call.stream, call.empty_final) == (True, False)
    assert read(request(prompt(), empty_final=True)).empty_final


def test_parameters_may_come_as_input_tensors_as_tensorrt_llm_and_vllm_take_them():
    call = read(request(prompt(b"hi", shape=(1, 1)),
                        tensor("max_tokens", np.array([[7]], np.int32), "INT32"),
                        tensor("stop", np.array([b".", b"!"], dtype=object), "BYTES"),
                        tensor("temperature", np.array([0.5], np.float32), "FP32"),
                        tensor("stream", np.array([False]), "BOOL"),
                        parameters={"seed": 3}))
    assert call.prompt == "hi" and call.shape == (1, 1)
    assert call.parameters == {"max_tokens": 7, "stop": [".", "!"], "temperature": 0.5,
                               "seed": 3}
    assert type(call.parameters["max_tokens"]) is int and call.stream is False


@pytest.mark.parametrize("build, words", [
    (lambda: request(tensor("max_tokens", np.array([3], np.int32), "INT32")),
     "no input 'text_input'"),
    (lambda: request(tensor("text_input", np.array([1.0], np.float32), "FP32")),
     "the prompt is a BYTES tensor"),
    (lambda: request(prompt(), tensor("max_tokens", np.array([1, 2], np.int32), "INT32")),
     "holds 2 elements"),
    (lambda: request(prompt(b"\xff\xfe")), "not valid UTF-8"),
    (lambda: request(prompt(), tensor("nope", np.array([1], np.int32), "INT32")),
     "unexpected inference input 'nope'"),
    (lambda: request(prompt(), tensor("max_tokens", np.array([3], np.int32), "INT32"),
                     parameters={"max_tokens": 3}), "given both"),
    (lambda: reserved(request(prompt())), "reserved"),
    (lambda: request(prompt(), parameters={"stream": "yes"}), "'stream' must be a bool"),
    (lambda: request(prompt(), outputs=[grpcclient.InferRequestedOutput("logits")]),
     "has no output 'logits'"),
])
def test_a_bad_generate_request_is_refused_naming_what_is_wrong(build, words):
    with pytest.raises(InvalidRequest, match=words):
        read(build())


def test_the_empty_final_flag_must_be_a_bool():
    r = request(prompt())
    r.parameters[EMPTY_FINAL].string_param = "yes"
    with pytest.raises(InvalidRequest, match=EMPTY_FINAL):
        read(r)


# -- responses -----------------------------------------------------------------------------
def text(new_text: str) -> dict:
    return {"text_output": new_text, "index": 0}


LAST = {"text_output": "", "final": True, "finish_reason": "length", "num_tokens": 3,
        "prompt_tokens": 4}


def written(call: GenerateCall, deliveries: list[list[dict]]) -> list:
    """The responses of a generation whose events come in `deliveries` (each delivered
    at once, the loop turning between them), as tritonclient reads them."""
    sent: list = []

    async def main():
        writer = StepWriter("lm", "1", call, sent.append)
        for delivery in deliveries:
            for event in delivery:
                writer.event(event)
            await asyncio.sleep(0)  # the loop turns: held text leaves
        return sent

    return [(grpcclient.InferResult(r.infer_response), r) for r in asyncio.run(main())]


def texts(results) -> list:
    return [None if r.as_numpy("text_output") is None else
            r.as_numpy("text_output").ravel()[0].decode() for r, _ in results]


def finals(results) -> list[bool]:
    return [raw.infer_response.parameters[FINAL].bool_param for _, raw in results]


def call_of(**kw) -> GenerateCall:
    return GenerateCall(**{"request_id": "g", "prompt": "p", "parameters": {},
                           "shape": (1,), "stream": True, "empty_final": False, **kw})


def test_each_step_is_a_response_and_the_final_flag_rides_on_the_last_text():
    results = written(call_of(), [[text("a")], [text("b")], [text("c"), LAST]])
    assert texts(results) == ["a", "b", "c"]
    assert finals(results) == [False, False, True]
    last = results[-1][0].get_response()
    assert last.id == "g" and last.model_name == "lm"
    assert last.parameters["finish_reason"].string_param == "length"
    assert last.parameters["num_tokens"].int64_param == 3
    assert "finish_reason" not in results[0][0].get_response().parameters


def test_with_the_empty_final_response_asked_for_the_flag_comes_alone():
    results = written(call_of(empty_final=True), [[text("a")], [text("b"), LAST]])
    assert texts(results) == ["a", "b", None]
    assert finals(results) == [False, False, True]
    assert list(results[-1][0].get_response().outputs) == []


def test_a_final_event_alone_ends_with_an_empty_text_that_carries_the_flag():
    results = written(call_of(), [[text("a")], [LAST]])
    assert texts(results) == ["a", ""] and finals(results) == [False, True]


def test_without_streaming_the_whole_text_comes_in_one_final_response():
    results = written(call_of(stream=False, shape=(1, 1)),
                      [[text("a")], [text("b")], [text("c"), LAST]])
    assert texts(results) == ["abc"] and finals(results) == [True]
    assert results[0][0].as_numpy("text_output").shape == (1, 1)


def test_an_error_response_names_its_request_and_ends_it():
    r = error_response(request(prompt(), request_id="bad"), "parameter 'x' is wrong")
    assert r.error_message == "parameter 'x' is wrong"
    assert r.infer_response.id == "bad" and r.infer_response.parameters[FINAL].bool_param
