"""The fuzz cases (tests/unit/deployments/http/fuzz_cases.py) through real HTTP, on both
fronts: every answer a 4xx `{"error": <str>}`, and the app serves after."""

from __future__ import annotations

import httpx
import pytest

from tests.unit.deployments.http.fuzz_cases import Target, cases, check, every_corruption

pytestmark = pytest.mark.e2e

SEED, N = 20_261_124, 80


def test_malformed_requests_over_http_get_4xx_errors(app, front_url):
    target = Target("square", "tinylm", app.config.ingress.max_body_bytes)
    with httpx.Client(base_url=front_url, timeout=30) as http:
        for case in cases(SEED, N, target):
            headers = [(k.encode(), v.encode()) for k, v in case.headers]
            r = http.request(case.method, case.path, content=case.body, headers=headers)
            check(case, r.status_code, dict(r.headers), r.content)
        alive = http.post("/v2/models/square/infer", json={"inputs": [
            {"name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [4.0]}]})
    assert alive.status_code == 200 and alive.json()["outputs"][0]["data"] == [16.0]


def test_each_body_corruption_alone_is_refused_by_the_real_models(app, front_url):
    target = Target("square", "tinylm", app.config.ingress.max_body_bytes)
    with httpx.Client(base_url=front_url, timeout=30) as http:
        for case in every_corruption(target):
            r = http.request(case.method, case.path, content=case.body)
            check(case, r.status_code, dict(r.headers), r.content)
        alive = http.post("/v1/completions", json={"model": "tinylm", "prompt": "Once",
                                                    "max_tokens": 2, "temperature": 0})
    assert alive.status_code == 200 and alive.json()["choices"][0]["text"]
