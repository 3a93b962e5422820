"""The raybatch_* series on Ray's own metrics endpoint, after traffic through the shared app.

Scrapes the session Ray's metrics port (tests/conftest.py) as Prometheus would:
every declared series shows up, counts grow by what was sent, the replica's own
compute series and the sampled gauges are there, and no series carries a label
outside the bounded set (Ray's own labels aside). The ingress's HTTP responses
are counted on both fronts (Serve's proxy and the fast path); an engine placed in
each of two ingress replicas records its model without clashing with the other.
"""

from __future__ import annotations

import urllib.request
from collections.abc import Callable

import numpy as np
import pytest

from batching.types import FlushReason
from deployments.metrics import SERIES
from tests.conftest import wait_until

pytestmark = pytest.mark.integration

OURS = {"model", "version", "priority", "reason", "outcome", "replica", "resource", "route",
        "status"}
RAYS = {"Component", "NodeAddress", "SessionName", "Version", "WorkerId", "JobId",
        "otel_scope_name", "otel_scope_version", "otel_scope_schema_url", "le"}
Samples = list[tuple[str, dict[str, str], float]]


def scrape(url: str) -> Samples:
    from prometheus_client.parser import text_string_to_metric_families

    text = urllib.request.urlopen(url, timeout=10).read().decode()
    return [(s.name, s.labels, s.value) for family in text_string_to_metric_families(text)
            for s in family.samples if s.name.startswith("ray_raybatch_")]


def total(samples: Samples, name: str, **labels: str) -> float:
    return sum(v for n, lab, v in samples if n == name and labels.items() <= lab.items())


def grew(url: str, name: str, by: float, before: Samples, **labels: str) -> Callable[[], bool]:
    def check() -> bool:
        return total(scrape(url), name, **labels) >= total(before, name, **labels) + by
    return check


INFER = "/v2/models/{model}/infer"


def send_http(base_url: str, n: int, model: str = "square") -> None:
    """`n` good infer requests, and one to a path no route has (404)."""
    import httpx

    body = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [2],
                        "data": [1.0, 2.0]}]}
    with httpx.Client(base_url=base_url, timeout=30) as http:
        for _ in range(n):
            r = http.post(f"/v2/models/{model}/infer", json=body)
            assert r.status_code == 200, r.text
        assert http.get("/v2/nothing/here").status_code == 404


def send_traffic(app) -> None:
    send_http(app.base_url, 3)  # through Serve's proxy (the app under Serve's wrapper)
    send_http(app.direct_url, 4)  # the fast path
    h = app.handle
    x = np.arange(4, dtype=np.float32)
    out = h.infer_bundle.remote("square", [{"INPUT0": x}] * 40).result(timeout_s=60)
    assert all(isinstance(o, dict) for o in out), out
    with pytest.raises(Exception, match="unexpected inference input 'WRONG' for model 'square'"):
        h.infer.remote("square", {"WRONG": x}).result(timeout_s=30)
    one = np.array([[3]], dtype=np.int32)
    h.infer.remote("accumulator", {"INPUT0": one},
                   {"sequence_id": "metrics-idle", "sequence_start": True}).result(timeout_s=30)
    final = h.generate.remote("tinylm", "Once upon", {"max_tokens": 8}).result(timeout_s=60)
    assert final["num_tokens"] >= 2


def test_every_layer_s_series_reach_ray_s_metrics_endpoint(app, metrics_url):
    before = scrape(metrics_url)
    send_traffic(app)
    for name, by, labels in [
        ("ray_raybatch_requests_total", 40, {"model": "square", "outcome": "ok"}),
        ("ray_raybatch_requests_total", 1, {"model": "square", "outcome": "invalid"}),
        ("ray_raybatch_http_requests_total", 7, {"route": INFER, "status": "200"}),
        ("ray_raybatch_http_requests_total", 2, {"route": "unmatched", "status": "404"}),
        ("ray_raybatch_queue_wait_seconds_count", 40, {"model": "square"}),
        ("ray_raybatch_batch_compute_seconds_count", 1, {"model": "square"}),
        ("ray_raybatch_generation_tokens_total", 2, {"model": "tinylm"}),
        ("ray_raybatch_generation_ttft_seconds_count", 1, {"model": "tinylm"}),
        ("ray_raybatch_generation_inter_token_seconds_count", 1, {"model": "tinylm"}),
    ]:
        wait_until(grew(metrics_url, name, by, before, **labels), timeout_s=60, every_s=0.5,
                   what=f"{name}{labels} to grow by {by}")
    # the sequence started above and never ended: freed after max_sequence_idle_s (5 s)
    name, labels = "ray_raybatch_sequences_idle_expired_total", {"model": "accumulator"}
    wait_until(grew(metrics_url, name, 1, before, **labels), timeout_s=60, every_s=0.5,
               what=f"{name}{labels} to grow by 1")
    samples = scrape(metrics_url)

    names = {n for n, _, _ in samples}
    for s in SERIES:
        suffixes = ("_bucket", "_count", "_sum") if s.kind == "histogram" else ("",)
        assert {s.exported + x for x in suffixes} <= names, s.name
    for name, labels, _ in samples:
        assert set(labels) <= OURS | RAYS, (name, labels)

    # a replica killed by another test is replaced: wait for the pool to be whole again
    wait_until(lambda: total(scrape(metrics_url), "ray_raybatch_replicas_running",
                             model="slowsquare") == 2, timeout_s=60, every_s=0.5,
               what="slowsquare's two replicas")
    replicas = {lab["replica"] for n, lab, _ in samples
                if n == "ray_raybatch_inflight_batches" and lab["model"] == "slowsquare"}
    assert len(replicas) >= 2, replicas
    reasons = {m: {lab["reason"] for n, lab, _ in samples
                   if n == "ray_raybatch_batches_total" and lab["model"] == m}
               for m in ("square", "tinylm")}
    assert reasons == {"square": {r.value for r in FlushReason}, "tinylm": {"step"}}
    assert total(samples, "ray_raybatch_batches_total", model="square") >= 1
    # counters of what has not happened are there, at 0 or more, from the start
    assert any(n == "ray_raybatch_requests_total" and lab.get("outcome") == "queue_full"
               and lab["model"] == "tinylm" for n, lab, _ in samples)
    assert total(samples, "ray_raybatch_queued_requests", model="gated", priority="1") == 0


def test_status_watch_refreshes_a_row_per_model_of_the_running_app(app):
    from tests.integration.test_cli import raybatch

    proc = raybatch("status", "--watch", "--count", "2", "--interval", "0.5",
                    "--address", app.gcs_address, "--app", app.name)
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = [line.split() for line in proc.stdout.splitlines() if line.startswith("square ")]
    assert len(rows) == 2, proc.stdout
    assert rows[0][2] == "-" and float(rows[1][2]) >= 0  # req/s once there are two looks
    header = next(line for line in proc.stdout.splitlines() if line.startswith("MODEL"))
    assert "WAIT p99" in header and "BATCH FILL" in header
    assert sum(line.startswith("tinylm ") for line in proc.stdout.splitlines()) == 2


def test_an_engine_in_each_of_two_ingress_replicas_records_its_model_apart(app, metrics_url):
    """placement ingress, two ingress replicas: each runs its own engine and replica pool.
    Counts add up across them, and each names its replicas by its rank (`ingress0-`,
    `ingress1-`): no two series of the endpoint share a label set."""
    from ray import serve

    from cluster.config import load_config
    from deployments.app import build_app

    name, model = "metrics-two-ingress", "local2"
    config = load_config({
        "app_name": name, "ingress": {"num_replicas": 2, "num_cpus": 0.1,
                                      "route_prefix": "/" + name},
        "metrics": {"interval_s": 0.5},
        "models": [{"name": model, "transformer": "deployments.models:Square",
                    "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1]}],
                    "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1]}],
                    "batching": {"max_batch_size": 8},
                    "replicas": {"min_replicas": 2, "max_replicas": 2, "num_cpus": 0.05},
                    # its 60 requests all wait, however slow the machine (no admission by
                    # time: that is not what this test is about)
                    "limits": {"max_queue_wait_s": None},
                    "batcher": {"placement": "ingress"}}]})
    before = scrape(metrics_url)
    handle = serve.run(build_app(config), name=name, route_prefix="/" + name)
    try:
        x = np.arange(3, dtype=np.float32)
        calls = [handle.infer.remote(model, {"INPUT0": x}) for _ in range(60)]
        for call in calls:
            np.testing.assert_array_equal(call.result(timeout_s=60)["OUTPUT0"], x * x)
        wait_until(grew(metrics_url, "ray_raybatch_requests_total", 60, before, model=model,
                        outcome="ok"), timeout_s=60, every_s=0.5, what=f"{model}'s 60 ok")

        def both_ingress_replicas_report() -> set[str]:
            replicas = {lab["replica"] for n, lab, _ in scrape(metrics_url)
                        if n == "ray_raybatch_inflight_batches" and lab["model"] == model}
            return replicas if {r.split("-")[0] for r in replicas} == {
                "ingress0", "ingress1"} else set()
        replicas = wait_until(both_ingress_replicas_report, timeout_s=60, every_s=0.5,
                              what="both ingress replicas' engines to report")
        assert replicas == {"ingress0-replica-0", "ingress1-replica-0"}  # one each
        samples = scrape(metrics_url)
        assert total(samples, "ray_raybatch_replicas_running", model=model) == 2
        assert total(samples, "ray_raybatch_requests_total", model=model, outcome="ok") == 60
        seen = [(n, tuple(sorted(lab.items()))) for n, lab, _ in samples]
        assert len(seen) == len(set(seen)), "two series share a name and label set"
    finally:
        serve.delete(name)
