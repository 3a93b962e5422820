"""The multi-tensor demo (two inputs, three outputs, one of them BYTES) with Triton's own
clients over HTTP and gRPC: the same answers as the model run alone, outputs selected per
request, binary or JSON per output over HTTP."""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

from batching.model import run_batch
from batching.tensors import TensorBatch
from deployments.models import TwoTower

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def want():
    model = TwoTower()
    model.setup("cpu")
    return lambda q, d: run_batch(model, TensorBatch({"query": q, "doc": d}))


@pytest.fixture(scope="module")
def data():
    rng = np.random.default_rng(7)
    return tuple(rng.standard_normal((4, 16)).astype(np.float32) for _ in range(2))


def tensors(module, q, d, binary=(True, True)):
    ins = [module.InferInput("query", list(q.shape), "FP32"),
           module.InferInput("doc", list(d.shape), "FP32")]
    for tensor, x, b in zip(ins, (q, d), binary):
        if module is httpclient:
            tensor.set_data_from_numpy(x, binary_data=b)
        else:
            tensor.set_data_from_numpy(x)
    return ins


def test_http_every_output_binary_and_json_mixed(app, want, data):
    q, d = data
    client = httpclient.InferenceServerClient(f"127.0.0.1:{app.port}")
    result = client.infer("twotower", tensors(httpclient, q, d, binary=(True, False)),
                          outputs=[httpclient.InferRequestedOutput("label", binary_data=False),
                                   httpclient.InferRequestedOutput("score", binary_data=True),
                                   httpclient.InferRequestedOutput("embedding")])
    expected = want(q, d)
    np.testing.assert_allclose(result.as_numpy("score"), expected["score"], rtol=1e-5)
    np.testing.assert_allclose(result.as_numpy("embedding"), expected["embedding"],
                               rtol=1e-5, atol=1e-6)
    # tritonclient.http reads a BYTES output sent as JSON as str, binary ones as bytes
    assert result.as_numpy("label").tolist() == [b.decode() for b in expected["label"]]
    outputs = {o["name"]: o for o in result.get_response()["outputs"]}
    assert "data" in outputs["label"] and "binary_data_size" in outputs["score"]["parameters"]
    meta = client.get_model_metadata("twotower")
    assert [t["name"] for t in meta["inputs"]] == ["query", "doc"]
    assert [t["datatype"] for t in meta["outputs"]] == ["FP32", "FP32", "BYTES"]


def test_http_selects_outputs_and_names_a_wrong_input(app, data):
    q, d = data
    client = httpclient.InferenceServerClient(f"127.0.0.1:{app.port}")
    result = client.infer("twotower", tensors(httpclient, q, d),
                          outputs=[httpclient.InferRequestedOutput("label")])
    assert [o["name"] for o in result.get_response()["outputs"]] == ["label"]
    with pytest.raises(InferenceServerException, match="needs inputs") as e:
        client.infer("twotower", tensors(httpclient, q, d)[:1])
    assert e.value.status() == "400"


def test_grpc_every_output_and_a_selection(app, want, data):
    q, d = data
    client = grpcclient.InferenceServerClient(f"127.0.0.1:{app.grpc_port}")
    headers = {"application": app.name}
    result = client.infer("twotower", tensors(grpcclient, q, d), headers=headers)
    expected = want(q, d)
    np.testing.assert_allclose(result.as_numpy("score"), expected["score"], rtol=1e-5)
    assert result.as_numpy("embedding").shape == (4, 8)
    assert result.as_numpy("label").tolist() == expected["label"].tolist()
    only = client.infer("twotower", tensors(grpcclient, q, d), headers=headers,
                        outputs=[grpcclient.InferRequestedOutput("score")])
    assert [o.name for o in only.get_response().outputs] == ["score"]
    with pytest.raises(InferenceServerException, match="disagree on the batch size") as e:
        client.infer("twotower", tensors(grpcclient, q, d[:2]), headers=headers)
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
