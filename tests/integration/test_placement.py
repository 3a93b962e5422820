"""`batcher.placement: ingress`: the engine in the ingress replica, on the real cluster.

`slowsquare-local` (tests/configs/app.yaml) has no batching actor: the ingress
replica runs the engine and owns two model replicas. Every way in (HTTP, the
handle, `RaybatchClient` through the handle) gets each caller its own x², the
batches are real batches, and its status looks like any model's.
"""

from __future__ import annotations

import asyncio

import httpx
import numpy as np
import pytest

from deployments.client import RaybatchClient
from tests.conftest import arun

pytestmark = pytest.mark.integration

MODEL = "slowsquare-local"


def test_every_way_in_gets_its_own_result_in_real_batches(app):
    before = app.stats(MODEL)
    client = RaybatchClient(app.handle)
    xs = [np.array([i, i + 0.5], np.float32) for i in range(120)]

    async def load():
        via_client = [client.infer(MODEL, {"INPUT0": x}) for x in xs[:80]]
        via_handle = [app.handle.infer.remote(MODEL, {"INPUT0": x}) for x in xs[80:]]
        outs = await asyncio.gather(*via_client, *via_handle)
        return [o["OUTPUT0"] for o in outs]

    for x, y in zip(xs, arun(load())):
        np.testing.assert_array_equal(y, x * x)
    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2], "data": [3, 4]}]}
    r = httpx.post(f"{app.base_url}/v2/models/{MODEL}/infer", json=body, timeout=30)
    assert r.status_code == 200, r.text
    assert r.json()["outputs"][0]["data"] == [9.0, 16.0]

    after = app.stats(MODEL)
    assert after["items"] - before["items"] == 2 * 120 + 2
    assert after["success"]["count"] - before["success"]["count"] == 121
    batches = after["batches"] - before["batches"]
    assert batches < 121 / 2, f"{batches} batches for 121 requests: nothing was batched"
    assert after["open_requests"] == 0


def test_status_shows_the_ingress_replicas_engine_and_its_replicas(app):
    s = app.stats(MODEL)
    assert (s["placement"], s["kind"], s["replicas"]) == ("ingress", "dynamic", 2)
    assert [r["state"] for r in s["replica_info"]] == ["ALIVE", "ALIVE"]
    assert all(r["pid"] > 0 and "outstanding_batches" in r for r in s["replica_info"])
    r = httpx.get(f"{app.base_url}/v2/models/{MODEL}/stats", timeout=30)
    assert r.status_code == 200 and r.json()["model_stats"][0]["name"] == MODEL
    assert httpx.get(f"{app.base_url}/v2/models/{MODEL}/ready", timeout=30).status_code == 200


def test_a_bad_request_is_a_400_and_a_bad_bundle_entry_fails_alone(app):
    body = {"inputs": [{"name": "WRONG", "datatype": "FP32", "shape": [1], "data": [1]}]}
    r = httpx.post(f"{app.base_url}/v2/models/{MODEL}/infer", json=body, timeout=30)
    assert r.status_code == 400 and "INPUT0" in r.json()["error"]
    ok = np.array([2.0], np.float32)
    out = app.handle.infer_entries.remote(
        MODEL, [(0, ok, None, None), (1, ok, 9, None)]).result(timeout_s=30)
    by_key = {k: (v, e) for k, v, e in out}
    np.testing.assert_array_equal(np.asarray(by_key[0][0], np.float32), [4.0])
    assert "priority=9" in str(by_key[1][1])
