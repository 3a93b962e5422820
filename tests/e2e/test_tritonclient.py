"""Triton's own `tritonclient.http`, unchanged, against the shared app over real HTTP."""

from __future__ import annotations

import httpx
import numpy as np
import pytest
import tritonclient.http as httpclient
from tritonclient.utils import InferenceServerException

pytestmark = pytest.mark.e2e
UNKNOWN = "Request for unknown model: 'nope' is not found"  # Triton's words


@pytest.fixture(scope="module")
def client(front_url):  # through Serve's proxy, and the fast path
    c = httpclient.InferenceServerClient(front_url.removeprefix("http://"), network_timeout=60)
    yield c
    c.close()


def infer(client, x: np.ndarray, *, binary: bool, model: str = "square", **kwargs):
    tensor = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x, binary_data=binary)
    wanted = httpclient.InferRequestedOutput("OUTPUT0", binary_data=binary)
    return client.infer(model, [tensor], outputs=[wanted], **kwargs)


def test_health(client):
    assert client.is_server_live()
    assert client.is_server_ready()
    assert client.is_model_ready("square")
    assert not client.is_model_ready("nope")


def test_server_and_model_metadata(client):
    assert client.get_server_metadata()["name"] == "raybatch"
    meta = client.get_model_metadata("square")
    assert meta["name"] == "square"
    assert meta["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": [-1]}]
    assert meta["outputs"] == [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1]}]


def test_model_config(client):
    config = client.get_model_config("square")
    assert config["name"] == "square"
    assert config["max_batch_size"] == 64
    assert [t["name"] for t in config["input"]] == ["INPUT0"]
    assert [t["name"] for t in config["output"]] == ["OUTPUT0"]


@pytest.mark.parametrize("binary", [True, False], ids=["binary", "json"])
def test_infer(client, binary):
    x = np.array([0.5, -3.0, 12.25, 7.0], np.float32)
    result = infer(client, x, binary=binary, request_id=f"req-{binary}")
    y = result.as_numpy("OUTPUT0")
    assert y.dtype == np.float32
    np.testing.assert_array_equal(y, x * x)
    response = result.get_response()
    assert response["model_name"] == "square" and response["id"] == f"req-{binary}"
    assert ("binary_data_size" in response["outputs"][0].get("parameters", {})) is binary


def test_infer_with_priority_and_timeout(client):
    x = np.array([2.0, 3.0], np.float32)
    y = infer(client, x, binary=True, priority=1, timeout=30_000_000).as_numpy("OUTPUT0")
    np.testing.assert_array_equal(y, x * x)
    with pytest.raises(InferenceServerException, match="priority=4 is out of range") as e:
        infer(client, x, binary=True, priority=4)
    assert e.value.status() == "400"


def test_infer_of_an_unknown_model_raises(client):
    with pytest.raises(InferenceServerException, match=UNKNOWN) as e:
        infer(client, np.array([1.0], np.float32), binary=True, model="nope")
    assert e.value.status() == "404" and e.value.message().startswith(UNKNOWN)


def test_inference_statistics_show_batches(client):
    for _ in range(3):
        infer(client, np.array([1.0, 2.0, 3.0], np.float32), binary=True)
    (stats,) = client.get_inference_statistics("square")["model_stats"]
    assert stats["name"] == "square" and stats["version"] == "1"
    assert int(stats["inference_count"]) >= 9
    assert int(stats["execution_count"]) >= 1
    sizes = {int(b["batch_size"]): int(b["compute_infer"]["count"])
             for b in stats["batch_stats"]}
    assert sizes and all(n >= 1 for n in sizes.values())
    assert sum(size * n for size, n in sizes.items()) == int(stats["inference_count"])
    assert int(stats["inference_stats"]["success"]["count"]) >= 3


def test_inference_statistics_of_all_models(app, client):
    infer(client, np.array([1.0], np.float32), binary=False)
    stats = client.get_inference_statistics()["model_stats"]
    assert sorted(s["name"] for s in stats) == sorted(m.name for m in app.config.models)


def test_versioned_routes_serve_the_configured_version_and_404_others(client):
    assert client.is_model_ready("square", model_version="1")
    assert client.get_model_metadata("square", model_version="1")["name"] == "square"
    res = infer(client, np.array([3.0], dtype=np.float32), binary=True, model_version="1")
    np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), [9.0])
    with pytest.raises(InferenceServerException, match="has version '1', not '7'"):
        infer(client, np.array([3.0], dtype=np.float32), binary=True, model_version="7")


def test_repository_index_and_extensions_are_the_grpc_services(client, app, front_url):
    """`POST /v2/repository/index` answers what gRPC's RepositoryIndex answers, and
    `GET /v2` lists the extensions gRPC's ServerMetadata lists."""
    import tritonclient.grpc as grpcclient

    header = {"application": app.name}
    grpc = grpcclient.InferenceServerClient(f"127.0.0.1:{app.grpc_port}")
    try:
        over_grpc = grpc.get_model_repository_index(headers=header, as_json=True)["models"]
        grpc_extensions = list(grpc.get_server_metadata(headers=header).extensions)
    finally:
        grpc.close()
    index = client.get_model_repository_index()
    assert sorted(m["name"] for m in index) == sorted(m.name for m in app.config.models)
    assert sorted(index, key=lambda m: m["name"]) == sorted(over_grpc, key=lambda m: m["name"])
    assert all(m["state"] == "READY" for m in index)
    ready = httpx.post(f"{front_url}/v2/repository/index", json={"ready": True}, timeout=30)
    assert sorted(m["name"] for m in ready.json()) == sorted(m["name"] for m in index)
    extensions = client.get_server_metadata()["extensions"]
    assert extensions == grpc_extensions
    assert {"binary_tensor_data", "statistics", "model_repository", "sequence",
            "generate"} == set(extensions)
