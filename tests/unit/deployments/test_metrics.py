"""The series table and the recorders that feed it, against fake metric objects (no Ray).

The table is checked for Prometheus conventions; the recorders for what reaches
each series: one observation per queued request's wait, increments (never
totals) from the sampled counts, gauges per priority level and replica, zeros
for every known label set of a counter before anything happened.
"""

from __future__ import annotations

import re

import pytest

from batching.metrics import OUTCOMES, BatchDone, BatchSent, HostSnapshot, LevelDepth, StepDone
from batching.types import FlushReason
from cluster.config import ModelConfig
from deployments import metrics as dm
from deployments.metrics import (
    SERIES,
    BatcherMetrics,
    CallerMetrics,
    HttpCounts,
    PoolSnapshot,
    ReplicaMetrics,
)

ALLOWED_LABELS = {"model", "version", "priority", "reason", "outcome", "replica", "resource",
                  "route", "status"}


def test_every_series_follows_prometheus_conventions():
    names = [s.name for s in SERIES]
    assert len(set(names)) == len(names)
    for s in SERIES:
        assert re.fullmatch(r"raybatch_[a-z_]+", s.name), s.name
        assert s.kind in ("counter", "gauge", "histogram"), s
        assert s.name.endswith("_total") == (s.kind == "counter"), s.name
        assert s.help.endswith(".") and len(s.help) > 20, s.name
        assert set(s.labels) <= ALLOWED_LABELS, (s.name, s.labels)
        assert not any("id" in label.split("_") for label in s.labels)
        if s.unit == "seconds":
            assert s.name.endswith("_seconds") and s.kind == "histogram", s.name
            assert s.buckets[0] <= 0.0001 and s.buckets[-1] >= 10  # sub-ms to seconds
        if s.kind == "histogram":
            assert list(s.buckets) == sorted(set(s.buckets)) and s.buckets[0] > 0, s.name
        else:
            assert s.buckets == (), s.name
        if s.recorded_in != "ingress":
            assert s.labels[:2] == ("model", "version"), s.name


def test_the_documented_series_are_all_declared():
    wanted = {"requests_total", "queued_requests", "queued_items", "queue_wait_seconds",
              "batch_size_items", "batch_cost", "batches_total", "batch_compute_seconds",
              "inflight_batches", "replicas_desired", "replicas_running", "replicas_pending",
              "replicas_pending_demand", "replica_deaths_total", "retried_batches_total",
              "sequences_live", "sequences_lost_total", "sequences_idle_expired_total",
              "generation_active_sequences", "generation_tokens_total",
              "generation_ttft_seconds", "generation_inter_token_seconds",
              "generation_cancelled_total", "http_requests_total"}
    assert {f"raybatch_{w}" for w in wanted} <= set(dm.BY_NAME)
    assert dm.BY_NAME["raybatch_requests_total"].exported == "ray_raybatch_requests_total"


class FakeMetric:
    def __init__(self, name: str) -> None:
        self.name = name
        self.calls: list[tuple[str, float, dict]] = []

    def inc(self, value, tags):
        assert value > 0  # what ray.util.metrics.Counter insists on
        self.calls.append(("inc", value, dict(tags)))

    def _record(self, value, tags):
        self.calls.append(("record", value, dict(tags)))

    def observe(self, value, tags):
        self.calls.append(("observe", value, dict(tags)))

    def set(self, value, tags):
        self.calls.append(("set", value, dict(tags)))

    def total(self, **labels) -> float:
        return sum(v for kind, v, tags in self.calls if kind in ("inc", "record")
                   and labels.items() <= tags.items())


@pytest.fixture
def fake(monkeypatch):
    """Every series as fake metric objects; a sampled histogram's gauges under their names."""
    gauges: dict[str, FakeMetric] = {}

    def gauge(name, help_, tag_keys):
        return gauges.setdefault(name, FakeMetric(name))

    registry = {s.name: dm.SampledHistogram(s, gauge) if s.sampled else FakeMetric(s.name)
                for s in SERIES}
    monkeypatch.setattr(dm, "_REGISTRY", registry)
    return {**registry, **gauges}


def model(kind: str = "dynamic", shards: int = 1, **batching) -> ModelConfig:
    return ModelConfig.model_validate({
        "name": "m", "version": "3", "transformer": "deployments.models:Square",
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1]}],
        "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1]}],
        "batching": {"kind": kind, **batching}, "batcher": {"shards": shards},
        "replicas": {"num_cpus": 0.5, "num_gpus": 1, "resources": {"numa0": 1}}})


def test_known_counter_label_sets_start_at_zero(fake):
    BatcherMetrics(model(priority_levels=2))
    requests = fake["raybatch_requests_total"].calls
    assert sorted(t["outcome"] for _, v, t in requests if v == 0) == sorted(OUTCOMES)
    reasons = {t["reason"] for _, _, t in fake["raybatch_batches_total"].calls}
    assert reasons == {r.value for r in FlushReason}
    assert fake["raybatch_retried_batches_total"].calls == [
        ("record", 0.0, {"model": "m", "version": "3"})]
    assert fake["raybatch_sequences_lost_total"].calls == []  # not a sequence model
    BatcherMetrics(model("iterative"))
    assert {t["reason"] for _, _, t in fake["raybatch_batches_total"].calls} >= {"step"}
    assert fake["raybatch_generation_tokens_total"].calls


def cumulative(fake, name: str, **labels) -> dict[str, float]:
    """le -> the last value set for a sampled histogram's `_bucket` gauge."""
    return {t["le"]: v for _, v, t in fake[name + "_bucket"].calls
            if labels.items() <= t.items()}


def test_batches_are_counted_here_and_reach_ray_only_when_sampled(fake):
    m = BatcherMetrics(model(priority_levels=2))
    before = {name: len(f.calls) for name, f in fake.items() if hasattr(f, "calls")}
    m.batch_sent(BatchSent(5, 7.5, "preferred", (0.001, 0.004), (1, 2)))
    m.batch_sent(BatchSent(1, 1.0, "delay", (40.0,), (1,)))
    m.batch_done(BatchDone(5, 0.02, 0.015))
    m.refused(["queue_full"])
    after = {name: len(f.calls) for name, f in fake.items() if hasattr(f, "calls")}
    assert after == before  # no Ray call per batch
    m.publish(snapshot())
    assert fake["raybatch_batches_total"].total(reason="preferred") == 1
    assert fake["raybatch_batches_total"].total(reason="delay") == 1
    assert fake["raybatch_requests_total"].total(outcome="queue_full") == 1
    sizes = cumulative(fake, "raybatch_batch_size_items")
    assert (sizes["1.0"], sizes["4.0"], sizes["8.0"], sizes["+Inf"]) == (1, 1, 2, 2)
    assert cumulative(fake, "raybatch_batch_cost")["8.0"] == 2
    latency = cumulative(fake, "raybatch_batch_latency_seconds")
    assert (latency["0.01"], latency["0.025"]) == (0, 1)
    assert fake["raybatch_generation_ttft_seconds_count"].calls == []  # not generative
    buckets = {(t["priority"], t["le"]): v
               for _, v, t in fake["raybatch_queue_wait_seconds_bucket"].calls}
    assert buckets[("1", "0.0005")] == 0 and buckets[("1", "0.001")] == 1  # le: at or below
    assert buckets[("1", "30.0")] == 1 and buckets[("1", "+Inf")] == 2  # cumulative
    assert buckets[("2", "0.0025")] == 0 and buckets[("2", "0.005")] == 1
    count = {t["priority"]: v for _, v, t in fake["raybatch_queue_wait_seconds_count"].calls}
    total = {t["priority"]: v for _, v, t in fake["raybatch_queue_wait_seconds_sum"].calls}
    assert count == {"1": 2, "2": 1} and total == pytest.approx({"1": 40.001, "2": 0.004})


def test_generation_steps_observe_each_first_text_and_one_gap(fake):
    m = BatcherMetrics(model("iterative"))
    m.step_done(StepDone(3, (0.1, 0.2), 0.01))
    m.step_done(StepDone(1, (), None))
    m.publish(snapshot(queued=(LevelDepth(1, 0, 0),)))
    ttft = fake["raybatch_generation_ttft_seconds_sum"].calls
    assert [v for _, v, _ in fake["raybatch_generation_ttft_seconds_count"].calls] == [2]
    assert ttft[-1][1] == pytest.approx(0.3)
    assert [v for _, v, _ in fake["raybatch_generation_inter_token_seconds_count"].calls] == [1]


def snapshot(**kw) -> HostSnapshot:
    base = {"queued": (LevelDepth(1, 2, 5), LevelDepth(2, 0, 0)),
            "inflight": (("replica-0", 2), ("replica-3", 1)), "outcomes": {"ok": 10}}
    return HostSnapshot(**{**base, **kw})


def test_sampled_counts_become_increments_and_gauges_are_set(fake):
    m = BatcherMetrics(model(priority_levels=2, shards=2), shard=1)
    pool = PoolSnapshot(desired=3, running=2, pending=1, demand={"CPU": 0.5, "GPU": 1.0})
    m.publish(snapshot(replica_deaths=1, retried_batches=2), pool)
    m.publish(snapshot(outcomes={"ok": 15, "deadline": 2}, replica_deaths=1,
                       retried_batches=2))
    requests = fake["raybatch_requests_total"]
    assert requests.total(outcome="ok") == 15 and requests.total(outcome="deadline") == 2
    assert [v for k, v, _ in requests.calls if k == "inc"] == [10, 5, 2]
    assert fake["raybatch_replica_deaths_total"].total() == 1
    assert fake["raybatch_retried_batches_total"].total() == 2
    queued = fake["raybatch_queued_items"].calls
    assert ("set", 5, {"model": "m", "version": "3", "priority": "1"}) in queued
    inflight = {t["replica"]: v for _, v, t in fake["raybatch_inflight_batches"].calls}
    assert inflight == {"shard1-replica-0": 2, "shard1-replica-3": 1}
    assert [v for _, v, _ in fake["raybatch_replicas_desired"].calls] == [3]
    demand = {t["resource"]: v for _, v, t in fake["raybatch_replicas_pending_demand"].calls}
    assert demand == {"CPU": 0.5, "GPU": 1.0}


def test_sequence_and_generation_gauges_and_counts(fake):
    m = BatcherMetrics(model("sequence"))
    m.publish(snapshot(queued=(LevelDepth(1, 1, 1),), live_sequences=4, sequences_lost=1,
                       sequences_idle_expired=3))
    assert fake["raybatch_sequences_live"].calls[-1][1] == 4
    assert fake["raybatch_sequences_lost_total"].total() == 1
    assert fake["raybatch_sequences_idle_expired_total"].total() == 3
    g = BatcherMetrics(model("iterative"))
    g.publish(snapshot(queued=(LevelDepth(1, 0, 0),), active_sequences=6,
                       tokens_generated=40, generations_cancelled=2))
    g.publish(snapshot(queued=(LevelDepth(1, 0, 0),), active_sequences=2,
                       tokens_generated=55, generations_cancelled=2))
    assert fake["raybatch_generation_tokens_total"].total() == 55
    assert fake["raybatch_generation_cancelled_total"].total() == 2
    assert fake["raybatch_generation_active_sequences"].calls[-1][1] == 2


def test_refusals_at_submit_join_the_host_s_outcomes_as_increments(fake):
    m = BatcherMetrics(model())
    m.refused(["queue_full", "queue_full", "invalid"])
    m.publish(snapshot(outcomes={"ok": 3, "invalid": 1}))
    m.refused(["invalid"])
    m.publish(snapshot(outcomes={"ok": 3, "invalid": 1}))
    incs = [(v, t["outcome"]) for k, v, t in fake["raybatch_requests_total"].calls
            if k == "inc"]
    assert incs == [(3, "ok"), (2, "invalid"), (2, "queue_full"), (1, "invalid")]


def test_callers_and_replicas_record_their_own_part(fake):
    CallerMetrics(model()).count("worker_died", 3)
    ReplicaMetrics(model()).compute(0.25)
    assert fake["raybatch_requests_total"].total(outcome="worker_died") == 3
    assert fake["raybatch_batch_compute_seconds"].calls[0][1] == 0.25


def test_http_counts_are_exported_as_increments_per_flush(fake):
    counts = {("POST /v2/models/{model}/infer", 200): 5}
    flusher = HttpCounts(counts)
    flusher.flush()
    counts[("POST /v2/models/{model}/infer", 200)] += 2
    counts[("GET /v2/health/ready", 503)] = 1
    flusher.flush()
    flusher.flush()  # nothing new: nothing sent
    calls = fake["raybatch_http_requests_total"].calls
    assert calls == [
        ("inc", 5, {"route": "POST /v2/models/{model}/infer", "status": "200"}),
        ("inc", 2, {"route": "POST /v2/models/{model}/infer", "status": "200"}),
        ("inc", 1, {"route": "GET /v2/health/ready", "status": "503"})]


def test_the_export_loop_flushes_on_its_clock_and_survives_a_failing_flush():
    import asyncio

    flushed, naps = [], []

    def flush():
        flushed.append(len(naps))
        if len(flushed) == 1:
            raise RuntimeError("Ray hiccup")

    async def sleep(s):
        naps.append(s)
        if len(naps) > 3:
            raise asyncio.CancelledError

    with pytest.raises(asyncio.CancelledError):
        asyncio.run(dm.every(0.5, flush, sleep=sleep))
    assert naps == [0.5] * 4 and flushed == [1, 2, 3]


def test_an_engine_in_one_of_several_ingress_replicas_names_its_replicas_apart(fake,
                                                                              monkeypatch):
    """Each ingress replica's engine has its own replica-0: the ingress rank tells them
    apart in the `replica` label (Ray's WorkerId label keeps the other series apart)."""
    from deployments.ingress import placement

    m = BatcherMetrics(model(), replica_prefix="ingress1-")
    m.publish(snapshot())
    inflight = {t["replica"] for _, _, t in fake["raybatch_inflight_batches"].calls}
    assert inflight == {"ingress1-replica-0", "ingress1-replica-3"}
    monkeypatch.setattr(placement, "ingress_rank", lambda: 2)
    config = model().model_copy(update={"batcher": model().batcher.model_copy(
        update={"placement": "ingress"})})
    assert placement.IngressPlacement(config, None, 3).engine.replica_prefix == "ingress2-"
    assert placement.IngressPlacement(config, None, 1).engine.replica_prefix == ""
