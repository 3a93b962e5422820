"""A generation over `ModelStreamInfer`: what a request to a generative model means, and
which responses its steps become. No server, no Ray.

The request, as Triton's vLLM and TensorRT-LLM backends read one: the prompt is the
BYTES input `text_input` (one element: shape [1] or [1, 1]); the generate parameters
(`max_tokens`, `stop`, `temperature`, `top_p`, `seed`, `priority`, `timeout`) come from
the request's `parameters` map or from input tensors of the same names (one element
each; `stop` may hold several), never from both; `stream` (BOOL, default true: one
response per step; false: one response with the whole text) and Triton's own
`triton_enable_empty_final_response` steer the responses. The parameters become the
dict the HTTP generate routes pass (`deployments.wire.generation.generate_request` checks
them, as it does for HTTP), so one stream is one sequence through the same batcher.

The responses, as Triton's decoupled stream sends them: each step's new text in the
BYTES output `text_output` (shaped like `text_input`), the request's `id`, and the
response parameter `triton_final_response` on every one, true only on the last. With
`triton_enable_empty_final_response` the last is an empty response (no outputs);
without it, the final flag rides on the last text. The last one also carries
`finish_reason`, `num_tokens` and `prompt_tokens`.

Invariant: a generation's text responses leave in step order and exactly one response
of it says final (an error response, if it fails, is that one: `stream.py`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from batching.errors import InvalidRequest
from cluster.config import TensorConfig
from deployments.grpc.codec import (
    check_outputs,
    decode_input,
    input_shape,
    raw_contents,
)
from deployments.grpc.stubs import service_pb2 as pb
from deployments.protocol import PayloadTooLarge
from deployments.protocol.binary import encode_binary, num_elements
from deployments.protocol.datatypes import NUMPY_DTYPES, check_datatype
from deployments.protocol.request import RequestedOutput

PROMPT = "text_input"
TEXT = "text_output"
PARAMETERS = ("max_tokens", "stop", "temperature", "top_p", "seed", "priority", "timeout")
STREAM = "stream"
EMPTY_FINAL = "triton_enable_empty_final_response"
FINAL = "triton_final_response"
INPUTS = (PROMPT, *PARAMETERS, STREAM)

Emit = Callable[[pb.ModelStreamInferResponse], None]


@dataclass(frozen=True, slots=True)
class GenerateCall:
    """One generation asked for on a stream."""

    request_id: str  # "" when the client gave none
    prompt: str
    parameters: dict[str, Any]  # as the HTTP generate routes pass them
    shape: tuple[int, ...]  # of text_input: every text_output has it too
    stream: bool  # one response per step (else one with the whole text)
    empty_final: bool  # end with an empty response that carries the final flag


def read_generate_request(request: Any, outputs: Mapping[str, TensorConfig], model: str,
                          max_bytes: int) -> GenerateCall:
    """The generation a `ModelInferRequest` to the generative `model` asks for."""
    check_outputs([RequestedOutput(o.name, True) for o in request.outputs], outputs, model)
    tensors = _input_values(request, model, max_bytes)
    if PROMPT not in tensors:
        raise InvalidRequest(f"the request has no input {PROMPT!r}: model {model!r} "
                             f"generates from a BYTES tensor {PROMPT!r} of shape [1] "
                             "holding the prompt")
    prompt, shape = tensors.pop(PROMPT)
    params, flags = _request_parameters(request.parameters)
    for name, (value, _) in tensors.items():
        if name in params or name in flags:
            raise InvalidRequest(f"{name!r} is given both as an input tensor and as a request "
                                 "parameter: give it once")
        (flags if name == STREAM else params)[name] = value
    stream = flags.get(STREAM, True)
    if not isinstance(stream, bool):
        raise InvalidRequest(f"{STREAM!r} must be a bool, got {stream!r}")
    return GenerateCall(request.id, prompt, params, shape, stream,
                        flags.get(EMPTY_FINAL, False))


def _input_values(request: Any, model: str, max_bytes: int
                  ) -> dict[str, tuple[Any, tuple[int, ...]]]:
    """Each input tensor as a Python value (a str for BYTES, a number or bool for one
    element, `stop` a list), with its shape."""
    raw = raw_contents(request)
    out: dict[str, tuple[Any, tuple[int, ...]]] = {}
    total = 0
    for i, tensor in enumerate(request.inputs):
        name, where = tensor.name, f"input {tensor.name!r}"
        if name not in INPUTS:
            raise InvalidRequest(f"unexpected inference input {name!r} for model {model!r}: "
                                 f"a generate request takes {list(INPUTS)}")
        if name in out:
            raise InvalidRequest(f"{where} appears twice; send each input once")
        datatype = check_datatype(tensor.datatype, where)
        shape = input_shape(tensor.shape, where)
        total += num_elements(shape) * max(NUMPY_DTYPES[datatype].itemsize, 1)
        if total > max_bytes:
            raise PayloadTooLarge(f"the inputs hold more than {max_bytes} bytes, this "
                                  "server's limit")
        array = decode_input(tensor, datatype, shape, raw[i] if raw else None, where)
        if name == PROMPT and datatype != "BYTES":
            raise InvalidRequest(f"{where} is {datatype}: the prompt is a BYTES tensor "
                                 "holding UTF-8 text")
        out[name] = (_value(name, array, where), tuple(shape))
    return out


def _value(name: str, array: np.ndarray, where: str) -> Any:
    values = [_text(v, where) if isinstance(v, bytes) else v for v in array.ravel().tolist()]
    if name == "stop":
        return values
    if len(values) != 1:
        raise InvalidRequest(f"{where} holds {len(values)} elements of shape "
                             f"{list(array.shape)}: send exactly one (shape [1] or [1, 1])")
    return values[0]


def _text(value: bytes, where: str) -> str:
    try:
        return value.decode("utf-8")
    except UnicodeDecodeError as e:
        raise InvalidRequest(f"{where} is not valid UTF-8 ({e.reason} at byte {e.start})"
                             ) from None


def _request_parameters(params: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, Any]]:
    """(generate parameters, stream flags) of the request's `parameters` map."""
    out: dict[str, Any] = {}
    flags: dict[str, Any] = {}
    for key, param in params.items():
        kind = param.WhichOneof("parameter_choice")
        if kind is None:
            raise InvalidRequest(f"parameter {key!r} has no value")
        value = getattr(param, kind)
        if key == EMPTY_FINAL:
            if kind != "bool_param":
                raise InvalidRequest(f"parameter {key!r} must be a bool, got {value!r}")
            flags[key] = value
        elif key.startswith("triton_"):
            raise InvalidRequest(f"parameter {key!r}: keys starting with 'triton_' are "
                                 "reserved")
        elif key == STREAM:
            flags[key] = value
        else:
            out[key] = value
    return out, flags


# -- responses ------------------------------------------------------------------------------
def text_response(model: str, version: str, call: GenerateCall, text: str | None,
                  final: bool, last: Mapping[str, Any] | None = None
                  ) -> pb.ModelStreamInferResponse:
    """A response of `call`: `text` in text_output (None: no outputs, Triton's empty
    response); `last`: the final event, whose finish reason and counts ride along."""
    response = pb.ModelStreamInferResponse()
    infer = response.infer_response
    infer.model_name, infer.model_version = model, version
    if call.request_id:
        infer.id = call.request_id
    if text is not None:
        infer.outputs.add(name=TEXT, datatype="BYTES", shape=call.shape)
        array = np.empty(1, dtype=object)
        array[0] = text.encode("utf-8")
        infer.raw_output_contents.append(encode_binary(array))
    infer.parameters[FINAL].bool_param = final
    if last is not None:
        infer.parameters["finish_reason"].string_param = str(last.get("finish_reason", ""))
        for key in ("num_tokens", "prompt_tokens"):
            if isinstance(last.get(key), int):
                infer.parameters[key].int64_param = last[key]
    return response


def error_response(request: Any, message: str) -> pb.ModelStreamInferResponse:
    """Triton's answer to a request of the stream that failed: `error_message`, with the
    request's id (and the final flag) so a client can tell which one."""
    response = pb.ModelStreamInferResponse(error_message=message)
    infer = response.infer_response
    infer.model_name, infer.model_version = request.model_name, request.model_version
    if request.id:
        infer.id = request.id
    infer.parameters[FINAL].bool_param = True
    return response


def final_response(response: pb.ModelInferResponse) -> pb.ModelStreamInferResponse:
    """A stateless model's one response on the stream (its only, so its final one)."""
    response.parameters[FINAL].bool_param = True
    return pb.ModelStreamInferResponse(infer_response=response)


class StepWriter:
    """A generation's events (`GenerateMux.stream`'s dicts) -> its responses, via `emit`.

    Without an empty final response, the final flag must ride on the last text, which
    is only known when the final event comes. The engine delivers a generation's last
    text and its final event together (one step's output, one poll), and the stream
    hands over what it already holds without yielding to the loop. So a text is held
    until the loop turns (`call_soon`): if the final event came first, the text leaves
    with the flag; else it leaves as it is, without waiting for the next step.
    """

    def __init__(self, model: str, version: str, call: GenerateCall, emit: Emit) -> None:
        self._model, self._version, self._call, self._emit = model, version, call, emit
        self._held: str | None = None  # a text waiting for the loop to turn
        self._parts: list[str] = []  # stream=false: the whole text so far

    def event(self, event: Mapping[str, Any]) -> None:
        call = self._call
        if event.get("final"):
            self._finish(event)
        elif not call.stream:
            self._parts.append(event[TEXT])
        elif call.empty_final:
            self._send(event[TEXT], False)
        else:
            self.flush()  # an earlier text of the same delivery
            self._held = event[TEXT]
            asyncio.get_running_loop().call_soon(self.flush)

    def flush(self) -> None:
        """Send the held text without the flag (before an error, or once the loop turned)."""
        if self._held is not None:
            text, self._held = self._held, None
            self._send(text, False)

    def _finish(self, last: Mapping[str, Any]) -> None:
        text, self._held = self._held, None
        if not self._call.stream:
            text = "".join(self._parts)
        if self._call.empty_final:
            if text is not None:  # stream=false: the text, then the empty final response
                self._send(text, False)
            self._send(None, True, last)
        else:  # no text held: the last step released none (an eos), so an empty text
            self._send(text or "", True, last)

    def _send(self, text: str | None, final: bool,
              last: Mapping[str, Any] | None = None) -> None:
        self._emit(text_response(self._model, self._version, self._call, text, final, last))
