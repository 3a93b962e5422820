"""Triton's own `tritonclient.grpc`, unchanged, against the shared app through Serve's gRPC
proxy: the HTTP tests' twins (health, metadata, config, infer, parameters, errors,
statistics, versions, sequences), and the status codes errors map to.

The session runs several Serve apps, so calls name theirs with the `application` header
(with one app, Serve routes to it without one).
"""

from __future__ import annotations

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
from tritonclient.utils import InferenceServerException

from tests.conftest import wait_until

pytestmark = pytest.mark.e2e
UNKNOWN = "Request for unknown model: 'nope' is not found"  # Triton's words


@pytest.fixture(scope="module")
def client(app):
    c = grpcclient.InferenceServerClient(f"127.0.0.1:{app.grpc_port}")
    yield c
    c.close()


@pytest.fixture(scope="module")
def app_header(app):
    return {"application": app.name}


def infer(client, hd, x: np.ndarray, model: str = "square", **kwargs):
    tensor = grpcclient.InferInput("INPUT0", list(x.shape), "FP32")
    tensor.set_data_from_numpy(x)
    return client.infer(model, [tensor], outputs=[grpcclient.InferRequestedOutput("OUTPUT0")],
                        headers=hd, **kwargs)


def test_health(client, app_header):
    assert client.is_server_live(headers=app_header)
    assert client.is_server_ready(headers=app_header)
    assert client.is_model_ready("square", headers=app_header)
    assert not client.is_model_ready("nope", headers=app_header)


def test_server_and_model_metadata(client, app_header):
    assert client.get_server_metadata(headers=app_header).name == "raybatch"
    meta = client.get_model_metadata("square", headers=app_header, as_json=True)
    assert meta["name"] == "square"
    assert meta["inputs"] == [{"name": "INPUT0", "datatype": "FP32", "shape": ["-1"]}]
    assert meta["outputs"] == [{"name": "OUTPUT0", "datatype": "FP32", "shape": ["-1"]}]


def test_model_config(client, app_header):
    config = client.get_model_config("square", headers=app_header, as_json=True)["config"]
    assert config["name"] == "square" and config["max_batch_size"] == 64
    assert [t["name"] for t in config["input"]] == ["INPUT0"]
    assert [t["name"] for t in config["output"]] == ["OUTPUT0"]


def test_infer(client, app_header):
    x = np.array([0.5, -3.0, 12.25, 7.0], np.float32)
    result = infer(client, app_header, x, request_id="req-grpc")
    y = result.as_numpy("OUTPUT0")
    assert y.dtype == np.float32
    np.testing.assert_array_equal(y, x * x)
    assert result.get_response().model_name == "square"
    assert result.get_response().id == "req-grpc"


def test_infer_with_priority_and_timeout(client, app_header):
    x = np.array([2.0, 3.0], np.float32)
    y = infer(client, app_header, x, priority=1, timeout=30_000_000).as_numpy("OUTPUT0")
    np.testing.assert_array_equal(y, x * x)
    with pytest.raises(InferenceServerException, match="priority=4 is out of range") as e:
        infer(client, app_header, x, priority=4)
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT"


def test_infer_of_an_unknown_model_is_not_found(client, app_header):
    with pytest.raises(InferenceServerException, match=UNKNOWN) as e:
        infer(client, app_header, np.array([1.0], np.float32), model="nope")
    assert e.value.status() == "StatusCode.NOT_FOUND" and e.value.message().startswith(UNKNOWN)


def test_a_missed_deadline_and_a_full_queue_get_their_status_codes(app, client, app_header,
                                                                     gate):
    answers: list = []

    def send(x: float) -> None:
        client.async_infer("gated", [_tensor(x)], headers=app_header,
                           callback=lambda result, error: answers.append((result, error)))

    gate.close()
    send(1.0)
    wait_until(lambda: app.stats("gated")["inflight_batches"] == 1, what="a running batch")
    with pytest.raises(InferenceServerException, match="passed its deadline") as e:
        infer(client, app_header, np.array([5.0], np.float32), model="gated", timeout=50_000)
    assert e.value.status() == "StatusCode.DEADLINE_EXCEEDED"
    send(2.0)
    send(3.0)
    wait_until(lambda: app.stats("gated")["queued_requests"] == 2, what="two queued")
    with pytest.raises(InferenceServerException, match="max_queue_size=2") as e:
        infer(client, app_header, np.array([4.0], np.float32), model="gated")
    assert e.value.status() == "StatusCode.RESOURCE_EXHAUSTED"
    gate.open()
    wait_until(lambda: len(answers) == 3, what="the held requests' answers")
    assert sorted(float(r.as_numpy("OUTPUT0")[0]) for r, error in answers) == [2.0, 3.0, 4.0]


def _tensor(x: float):
    tensor = grpcclient.InferInput("INPUT0", [1], "FP32")
    tensor.set_data_from_numpy(np.array([x], np.float32))
    return tensor


def test_inference_statistics_show_batches(client, app_header):
    for _ in range(3):
        infer(client, app_header, np.array([1.0, 2.0, 3.0], np.float32))
    (stats,) = client.get_inference_statistics("square", headers=app_header,
                                               as_json=True)["model_stats"]
    assert stats["name"] == "square" and stats["version"] == "1"
    assert int(stats["inference_count"]) >= 9 and int(stats["execution_count"]) >= 1
    sizes = {int(b["batch_size"]): int(b["compute_infer"]["count"])
             for b in stats["batch_stats"]}
    assert sum(size * n for size, n in sizes.items()) == int(stats["inference_count"])


def test_versioned_calls_serve_the_configured_version_and_refuse_others(client, app_header):
    assert client.is_model_ready("square", model_version="1", headers=app_header)
    res = infer(client, app_header, np.array([3.0], np.float32), model_version="1")
    np.testing.assert_array_equal(res.as_numpy("OUTPUT0"), [9.0])
    with pytest.raises(InferenceServerException, match="has version '1', not '7'") as e:
        infer(client, app_header, np.array([3.0], np.float32), model_version="7")
    assert e.value.status() == "StatusCode.NOT_FOUND" and e.value.message().startswith(
        "Request for unknown model: 'square' version 7 is not found")


@pytest.mark.parametrize("sequence_id", [4343, "grpc-seq"])
def test_sequences_with_int_and_string_ids(client, app_header, sequence_id):
    values, sums = [11, 7, 5], []
    for i, v in enumerate(values):
        tensor = grpcclient.InferInput("INPUT0", [1, 1], "INT32")
        tensor.set_data_from_numpy(np.array([[v]], np.int32))
        out = client.infer("accumulator", [tensor], sequence_id=sequence_id,
                           sequence_start=i == 0, sequence_end=i == len(values) - 1,
                           headers=app_header)
        sums.append(int(out.as_numpy("OUTPUT0")[0][0]))
    assert sums == list(np.cumsum(values))
    tensor = grpcclient.InferInput("INPUT0", [1, 1], "INT32")
    tensor.set_data_from_numpy(np.array([[1]], np.int32))
    with pytest.raises(InferenceServerException, match="sequence_start") as e:
        client.infer("accumulator", [tensor], sequence_id=999_998, headers=app_header)
    assert e.value.status() == "StatusCode.INVALID_ARGUMENT"
