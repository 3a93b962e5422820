"""The gRPC service without Ray or a network: tritonclient.grpc's own request protos go
through GrpcServicer, the real ModelRoute and the real models (a fake batching actor runs
each bundle in process), and come back as tritonclient reads them."""

from __future__ import annotations

import asyncio
import importlib.metadata
import re
import time

import grpc
import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.grpc import service_pb2 as pb
from tritonclient.grpc._utils import _get_inference_request

from batching.errors import (
    DeadlineExceeded,
    QueueFull,
    RaybatchError,
    SequenceLost,
    WorkerDied,
)
from batching.model import run_batch
from cluster.config import load_config
from deployments.grpc import GrpcServicer
from deployments.ingress.route import ModelRoute
from deployments.models import Square, TwoTower
from deployments.protocol.wording import unknown_model
from deployments.wire.bundles import entries
from tests.conftest import APP_CONFIG


class FakeBatcher:
    """A batching actor in process: each bundle entry runs alone on the model, or fails
    with `error` when one is set."""

    def __init__(self, model, error: BaseException | None = None) -> None:
        self.model, self.error, self.bundles = model, error, []
        self.infer = self

    async def remote(self, bundle, caller=None, sent=None):
        bundle = list(entries(bundle))  # a bundle of same-shaped requests comes Stacked
        self.bundles.append(bundle)
        if self.error is not None:
            return [(key, None, self.error) for key, *_ in bundle]
        return [(key, run_batch(self.model, items), None) for key, items, *_ in bundle]


class Served:
    def __init__(self, config, batcher) -> None:
        self.config, self.batcher = config, batcher
        self.route = ModelRoute(config, [lambda: batcher])


class Context:
    def __init__(self) -> None:
        self.code, self.details = None, None

    def set_code(self, code) -> None:
        self.code = code

    def set_details(self, details) -> None:
        self.details = details


@pytest.fixture(scope="module")
def models():
    config = load_config(APP_CONFIG)
    tower, square = TwoTower(), Square()
    tower.setup("cpu")
    return {"twotower": Served(config.model("twotower"), FakeBatcher(tower)),
            "square": Served(config.model("square"), FakeBatcher(square))}


class UnknownModel(RaybatchError):
    http_status = 404


def servicer(models, ready=True, **server) -> GrpcServicer:
    def get(name, version):
        if name not in models:
            raise UnknownModel(unknown_model(name, models))
        return models[name]

    async def is_ready(m):
        return ready

    async def stats(m):
        return {"items": 6, "batches": 2, "by_size": {2: 1, 4: 1},
                "compute_s_by_size": {2: 0.001, 4: 0.002},
                "success": {"count": 3, "s": 0.01}}

    return GrpcServicer(get, models.values, is_ready, stats, max_bytes=1 << 20, **server)


def call(svc, method: str, request, context=None):
    return asyncio.run(getattr(svc, method)(request, context or Context()))


def infer_request(model, inputs, outputs=None, **kw):
    args = dict(model_version="", request_id="", outputs=outputs, sequence_id=0,
                sequence_start=False, sequence_end=False, priority=0, timeout=None,
                parameters=None)
    return _get_inference_request(model, inputs, **{**args, **kw})


def tower_inputs(q, d, raw=True):
    ins = [grpcclient.InferInput("query", list(q.shape), "FP32"),
           grpcclient.InferInput("doc", list(d.shape), "FP32")]
    ins[0].set_data_from_numpy(q)
    ins[1].set_data_from_numpy(d)
    if not raw:  # typed contents instead of raw_input_contents
        request_inputs = []
        for tensor, x in zip(ins, (q, d)):
            t = tensor._get_tensor()
            t.contents.fp32_contents.extend(x.ravel().tolist())
            request_inputs.append(t)
        return request_inputs
    return ins


def test_model_infer_returns_every_output_of_a_multi_tensor_model(models):
    rng = np.random.default_rng(0)
    q, d = (rng.standard_normal((3, 16)).astype(np.float32) for _ in range(2))
    response = call(servicer(models), "ModelInfer",
                    infer_request("twotower", tower_inputs(q, d), request_id="r1"))
    result = grpcclient.InferResult(response)
    expected = run_batch(models["twotower"].batcher.model,
                         models["twotower"].route.input_array({"query": q, "doc": d}))
    np.testing.assert_allclose(result.as_numpy("score"), expected["score"], rtol=1e-6)
    assert result.as_numpy("embedding").shape == (3, 8)
    assert result.as_numpy("label").tolist() == expected["label"].tolist()
    assert response.id == "r1" and response.model_name == "twotower"


def test_typed_contents_work_like_raw_ones_and_outputs_select_what_comes_back(models):
    q, d = np.ones((2, 16), np.float32), np.eye(2, 16, dtype=np.float32)
    request = pb.ModelInferRequest(model_name="twotower", inputs=tower_inputs(q, d, raw=False))
    request.outputs.add(name="label")
    response = call(servicer(models), "ModelInfer", request)
    assert [o.name for o in response.outputs] == ["label"]
    assert grpcclient.InferResult(response).as_numpy("label").shape == (2,)


@pytest.mark.parametrize("mutate, code, match", [
    (lambda r: r.inputs[0].__setattr__("datatype", "FP64"), "INVALID_ARGUMENT",
     "inference input 'query' data-type is 'FP64', but model 'twotower' expects 'FP32'"),
    (lambda r: r.inputs[0].__setattr__("name", "nope"), "INVALID_ARGUMENT",
     "unexpected inference input 'nope' for model 'twotower'"),
    (lambda r: r.inputs.pop(), "INVALID_ARGUMENT", r"raw_input_contents has 2 entries for 1"),
    (lambda r: r.raw_input_contents.__setitem__(1, b"\0" * 12), "INVALID_ARGUMENT",
     "input 'doc': binary_data_size is 12 bytes"),
    (lambda r: r.outputs.add(name="nope"), "INVALID_ARGUMENT", "has no output 'nope'"),
    (lambda r: r.__setattr__("model_name", "nope"), "NOT_FOUND",
     "Request for unknown model: 'nope' is not found"),
    (lambda r: r.parameters["priority"].__setattr__("string_param", "high"),
     "INVALID_ARGUMENT", "parameter 'priority' must be a non-negative integer"),
])
def test_a_bad_request_gets_a_status_code_and_a_message_naming_what_is_wrong(
        models, mutate, code, match):
    request = infer_request("twotower", tower_inputs(np.ones((1, 16), np.float32),
                                                     np.ones((1, 16), np.float32)))
    mutate(request)
    context = Context()
    response = call(servicer(models), "ModelInfer", request, context)
    assert context.code == getattr(grpc.StatusCode, code)
    assert re.search(match, context.details), context.details
    assert response == pb.ModelInferResponse()


@pytest.mark.parametrize("error, code", [
    (QueueFull("queue full"), grpc.StatusCode.RESOURCE_EXHAUSTED),
    (DeadlineExceeded("too late"), grpc.StatusCode.DEADLINE_EXCEEDED),
    (WorkerDied("the batching actor failed"), grpc.StatusCode.UNAVAILABLE),
    (SequenceLost("start it again"), grpc.StatusCode.FAILED_PRECONDITION),
])
def test_engine_errors_map_to_their_grpc_codes(error, code):
    config = load_config(APP_CONFIG).model("square")
    served = {"square": Served(config, FakeBatcher(Square(), error=error))}
    x = np.array([1.0, 2.0], np.float32)
    tensor = grpcclient.InferInput("INPUT0", [2], "FP32")
    tensor.set_data_from_numpy(x)
    context = Context()
    call(servicer(served), "ModelInfer", infer_request("square", [tensor]), context)
    assert context.code == code and context.details == str(error)


def test_request_parameters_reach_the_route(models):
    x = np.array([3.0], np.float32)
    tensor = grpcclient.InferInput("INPUT0", [1], "FP32")
    tensor.set_data_from_numpy(x)
    request = infer_request("square", [tensor], priority=1, timeout=2_000_000)
    before = time.monotonic()
    response = call(servicer(models), "ModelInfer", request)
    after = time.monotonic()
    assert grpcclient.InferResult(response).as_numpy("OUTPUT0").tolist() == [9.0]
    _, _, priority, deadline, *_ = models["square"].batcher.bundles[-1][0]
    # the 2 s timeout, as the instant the route set from it while the call ran
    assert priority == 1 and before + 2.0 <= deadline <= after + 2.0


def test_health_metadata_config_and_statistics(models):
    svc = servicer(models)
    assert call(svc, "ServerLive", pb.ServerLiveRequest()).live
    assert call(svc, "ServerReady", pb.ServerReadyRequest()).ready
    assert not call(servicer(models, ready=False), "ServerReady", pb.ServerReadyRequest()).ready
    assert call(svc, "ModelReady", pb.ModelReadyRequest(name="twotower")).ready
    assert not call(svc, "ModelReady", pb.ModelReadyRequest(name="nope")).ready
    meta = call(svc, "ModelMetadata", pb.ModelMetadataRequest(name="twotower"))
    assert [(t.name, t.datatype, list(t.shape)) for t in meta.outputs] == [
        ("score", "FP32", [-1]), ("embedding", "FP32", [-1, 8]), ("label", "BYTES", [-1])]
    config = call(svc, "ModelConfig", pb.ModelConfigRequest(name="twotower")).config
    assert config.max_batch_size == 32 and list(config.input[0].dims) == [16]
    assert list(config.dynamic_batching.preferred_batch_size) == [8, 32]
    stats = call(svc, "ModelStatistics", pb.ModelStatisticsRequest(name="square")).model_stats
    assert stats[0].inference_count == 6 and stats[0].execution_count == 2
    assert sorted(b.batch_size for b in stats[0].batch_stats) == [2, 4]
    every = call(svc, "ModelStatistics", pb.ModelStatisticsRequest()).model_stats
    assert sorted(s.name for s in every) == ["square", "twotower"]
    context = Context()
    call(svc, "ModelConfig", pb.ModelConfigRequest(name="nope"), context)
    assert context.code == grpc.StatusCode.NOT_FOUND


def test_server_metadata_is_the_configured_name_and_extensions():
    meta = call(servicer({}), "ServerMetadata", pb.ServerMetadataRequest())
    assert meta.name == "raybatch" and meta.version == importlib.metadata.version("raybatch")
    assert list(meta.extensions) == ["binary_tensor_data", "model_repository", "statistics"]
    svc = servicer({}, server_name="triton", extensions=("statistics", "sequence"))
    meta = call(svc, "ServerMetadata", pb.ServerMetadataRequest())
    assert (meta.name, list(meta.extensions)) == ("triton", ["statistics", "sequence"])


def test_the_repository_index_is_the_https_and_filters_the_ready_ones(models):
    every = call(servicer(models, ready=False), "RepositoryIndex", pb.RepositoryIndexRequest())
    assert [(m.name, m.version, m.state) for m in every.models] == [
        ("twotower", "1", "UNAVAILABLE"), ("square", "1", "UNAVAILABLE")]
    ready = call(servicer(models, ready=False), "RepositoryIndex",
                 pb.RepositoryIndexRequest(ready=True))
    assert list(ready.models) == []
    ready = call(servicer(models), "RepositoryIndex", pb.RepositoryIndexRequest(ready=True))
    assert [m.state for m in ready.models] == ["READY", "READY"]
