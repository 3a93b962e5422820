"""The HTTP fast path on a real Ray: requests to the ingress replica's own port are
served by Raybatch's app in front of Serve's per-request wrapper; the rest (Serve's
health and routes) still reach Serve."""

from __future__ import annotations

import httpx
import pytest

pytestmark = pytest.mark.e2e

BODY = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2], "data": [1.5, 2.0]}]}


def test_the_replica_port_serves_the_protocol_without_serves_wrapper(app):
    with httpx.Client(timeout=30) as http:
        direct = http.post(f"{app.direct_url}/v2/models/square/infer", json=BODY)
        proxied = http.post(f"{app.base_url}/v2/models/square/infer", json=BODY)
    for r in (direct, proxied):
        assert r.status_code == 200, r.text
        assert r.json()["outputs"][0]["data"] == [2.25, 4.0]
    # Serve's request-id middleware sits inside the wrapper the fast path skips
    assert "x-request-id" in proxied.headers and "x-request-id" not in direct.headers


def test_serves_own_routes_pass_through(app):
    with httpx.Client(timeout=30) as http:
        assert http.get(f"{app.direct_url}/-/healthz").status_code == 200
        r = http.get(f"{app.direct_url}/nothing-here")
    assert r.status_code == 404 and set(r.json()) == {"error"}  # Serve hands it to the app


def test_the_ingress_counts_its_responses(app):
    before = app.handle.http_counts.remote().result(timeout_s=30)
    with httpx.Client(timeout=30) as http:
        http.post(f"{app.direct_url}/v2/models/square/infer", json=BODY)
        http.put(f"{app.direct_url}/v2/models/square/infer")
    after = app.handle.http_counts.remote().result(timeout_s=30)
    for key in (("/v2/models/{model}/infer", 200), ("/v2/models/{model}/infer", 405)):
        assert after.get(key, 0) - before.get(key, 0) >= 1, (key, after)
