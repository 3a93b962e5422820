"""Two models in one batching actor (`batcher.group: pair` in tests/configs/app.yaml): one
actor process serves both, through the native front, Serve's HTTP and the handle, each
client getting its own model's answer, and each model counting only its own requests;
the ingress's bundles reach the shared actor on its direct connection."""

from __future__ import annotations

import json
import socket
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from tests.conftest import alive_pids
from tests.unit.deployments.http.wire import parse_responses, request

pytestmark = pytest.mark.e2e

MODELS = {"pair-square": lambda x: x * x, "pair-plus1": lambda x: x + 1}


def body(x: float) -> bytes:
    return json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [1],
                                   "data": [x]}]}).encode()


def pipelined(port: int, model: str, xs: list[float]) -> list:
    with socket.create_connection(("127.0.0.1", port), timeout=60) as sock:
        sock.sendall(b"".join(request("POST", f"/v2/models/{model}/infer", body(x))
                              for x in xs))
        got = b""
        while True:
            responses, _ = parse_responses(got)
            if len(responses) == len(xs):
                return responses
            chunk = sock.recv(65536)
            assert chunk, f"{model}: the connection closed after {len(responses)} answers"
            got += chunk


def test_two_models_in_one_batching_actor_each_answer_and_count_their_own(app):
    assert len(alive_pids("SERVE_DEPLOYMENT_ACTOR::", "::batcher-group-pair")) == 1
    assert not alive_pids("SERVE_DEPLOYMENT_ACTOR::", "::batcher-pair-square")
    before = {m: app.stats(m)["success"]["count"] for m in MODELS}
    port = app.config.ingress.native_port
    jobs = [(m, [float(c * 10 + i) for i in range(10)]) for c in range(8) for m in MODELS]
    with ThreadPoolExecutor(16) as pool:
        answers = list(pool.map(lambda job: pipelined(port, *job), jobs))
    for (model, xs), responses in zip(jobs, answers):
        for x, r in zip(xs, responses):
            assert r.status == 200, (model, x, r.body)
            assert r.json()["outputs"][0]["data"] == [MODELS[model](x)], (model, x)
    x = np.array([3.0], np.float32)  # and through the handle
    assert app.handle.infer.remote("pair-plus1", {"INPUT0": x}).result(
        timeout_s=60)["OUTPUT0"].tolist() == [4.0]
    after = {m: app.stats(m) for m in MODELS}
    assert after["pair-square"]["success"]["count"] - before["pair-square"] == 80
    assert after["pair-plus1"]["success"]["count"] - before["pair-plus1"] == 81
    assert all(a["linked_callers"] >= 1 for a in after.values()), after


def test_a_lone_request_waits_on_no_timer_on_any_hop(app):
    """`pair-plus1` waits up to 600 s for a fuller batch unless idle (`idle_dispatch`), and
    its replica is an actor of its own: a lone request, from the native front through the
    shared batching actor to the replica and back, is answered long before any hop's timer
    could fire (the socket gives up after 60 s), in a batch sent because the model was idle,
    on the batching actor's direct connection to its replica."""
    port = app.config.ingress.native_port
    before = app.stats("pair-plus1")
    for i in range(3):  # one at a time: each alone
        [r] = pipelined(port, "pair-plus1", [float(100 + i)])
        assert r.status == 200 and r.json()["outputs"][0]["data"] == [101.0 + i], r.body
    after = app.stats("pair-plus1")
    sent = {k: v - before["by_reason"].get(k, 0) for k, v in after["by_reason"].items()}
    assert {k: v for k, v in sent.items() if v} == {"idle": 3}, after["by_reason"]
    [replica] = after["replica_info"]
    assert not replica["in_process"] and replica["link_batches"] >= 1, replica
    assert replica["link_hosts"] == ["same-node"], replica  # a Unix socket on one node
    assert after["link_hosts"] == ["same-node"], after  # the ingress to the batching actor too
