"""Errors whose cause Triton names start with Triton's exact words (then Raybatch's hint),
on every front: the HTTP codec, the gRPC codec, the route (handle API, gRPC shapes) and
the engine's full queues. Triton's words are copied from its server
(triton-inference-server/core: model_repository_manager.cc, model.cc, infer_request.cc,
sequence_utils.h, scheduler_utils.cc)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from batching.dynamic.batcher import DynamicBatcher
from batching.dynamic.policy import DynamicPolicy, QueuePolicy
from batching.errors import InvalidRequest, QueueFull
from batching.types import Request
from cluster.config import ModelConfig
from deployments.ingress.route import ModelRoute
from deployments.protocol import ModelSpec, RequestLimits, TensorSpec, parse_infer_request
from deployments.protocol.wording import (
    no_correlation_id,
    unexpected_input,
    unexpected_shape,
    unknown_model,
    unknown_version,
    wrong_datatype,
)

SPEC = ModelSpec("simple", inputs=[TensorSpec("INPUT0", "INT32", [-1, 16])],
                 outputs=[TensorSpec("OUTPUT0", "INT32", [-1, 16])], max_batch_size=8)


def test_each_message_starts_with_tritons_words_then_a_hint():
    cases = [
        (unknown_model("x", ["b", "a"]), "Request for unknown model: 'x' is not found",
         "['a', 'b']"),
        (unknown_version("m", "7", "1"), "Request for unknown model: 'm' version 7 is not found",
         "has version '1', not '7'"),
        (unexpected_input("IN", "m", ["INPUT0"]), "unexpected inference input 'IN' for model 'm'",
         "['INPUT0']"),
        (wrong_datatype("IN", "FP32", "m", "INT32"),
         "inference input 'IN' data-type is 'FP32', but model 'm' expects 'INT32'",
         "convert the data to INT32"),
        (unexpected_shape("IN", "m", (-1, 16), (1, 8)),
         "unexpected shape for input 'IN' for model 'm'. Expected [-1,16], got [1,8]",
         "dim 1 must be 16, not 8"),
        (unexpected_shape("IN", "m", (-1, 16), (16,)),
         "unexpected shape for input 'IN' for model 'm'. Expected [-1,16], got [16]",
         "rank 1 but the model expects rank 2"),
        (no_correlation_id("seq"), "inference request to model 'seq' must specify a non-zero "
         "or non-empty correlation ID", "sequence_id"),
    ]
    for message, triton, hint in cases:
        assert message.startswith(triton), message
        assert hint in message[len(triton):], message


def test_a_long_shape_is_not_echoed_whole():
    message = unexpected_shape("IN", "m", (-1, 16), tuple(range(10_000)))
    assert len(message) < 300 and ",...]" in message


def http_body(name="INPUT0", datatype="INT32", shape=(1, 16)) -> bytes:
    data = [0] * int(np.prod(shape))
    return json.dumps({"inputs": [{"name": name, "datatype": datatype, "shape": list(shape),
                                   "data": data}]}).encode()


@pytest.mark.parametrize(("body", "start"), [
    (http_body(name="IN"), "unexpected inference input 'IN' for model 'simple'"),
    (http_body(datatype="FP32"),
     "inference input 'INPUT0' data-type is 'FP32', but model 'simple' expects 'INT32'"),
    (http_body(shape=(1, 8)),
     "unexpected shape for input 'INPUT0' for model 'simple'. Expected [-1,16], got [1,8]"),
])
def test_the_http_codec_uses_tritons_words(body, start):
    with pytest.raises(InvalidRequest) as e:
        parse_infer_request(body, {}, SPEC, RequestLimits())
    assert str(e.value).startswith(start), str(e.value)


def simple_route(**batching) -> ModelRoute:
    config = ModelConfig.model_validate({
        "name": "simple", "transformer": "deployments.models:Square",
        "inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [-1, 16]}],
        "outputs": [{"name": "OUTPUT0", "datatype": "INT32", "shape": [-1, 16]}],
        "batching": batching or {"max_batch_size": 4}})
    return ModelRoute(config, [lambda: None])


@pytest.mark.parametrize(("inputs", "start"), [
    ({"IN": np.zeros((1, 16), np.int32)}, "unexpected inference input 'IN' for model 'simple'"),
    ({"INPUT0": np.zeros((1, 16), np.float32)},
     "inference input 'INPUT0' data-type is 'FP32', but model 'simple' expects 'INT32'"),
    ({"INPUT0": np.zeros((1, 8), np.int32)},
     "unexpected shape for input 'INPUT0' for model 'simple'. Expected [-1,16], got [1,8]"),
])
def test_the_route_uses_tritons_words(inputs, start):
    """The handle API, and gRPC's shapes, are checked here."""
    with pytest.raises(InvalidRequest) as e:
        simple_route().input_array(inputs)
    assert str(e.value).startswith(start), str(e.value)


@pytest.mark.parametrize("sequence_id", [None, 0, ""])
def test_a_stateful_request_without_a_sequence_id_gets_tritons_words(sequence_id):
    route = simple_route(kind="sequence", max_batch_size=4)
    with pytest.raises(InvalidRequest) as e:
        route.submit(np.zeros((1, 16), np.int32), None, None, (sequence_id, True, False))
    assert str(e.value).startswith(no_correlation_id("simple").split(";")[0])


def test_a_full_queue_starts_with_tritons_words():
    batcher = DynamicBatcher(DynamicPolicy(
        max_batch_size=8, default_queue_policy=QueuePolicy(max_queue_size=1)))
    batcher.submit(Request("a", [1]), 0.0)
    with pytest.raises(QueueFull) as e:
        batcher.submit(Request("b", [1]), 0.0)
    assert str(e.value).startswith("Exceeds maximum queue size: ")
    assert "max_queue_size=1" in str(e.value)
