"""Statistics of a sharded model: merged once, counted once."""

from __future__ import annotations

from cluster.config import load_config
from deployments.batcher.actor import shard_config
from deployments.protocol.stats import merge_stats, model_counters


def shard_stats(batches, items, by_size, ok):
    return {"batches": batches, "items": items, "queued_requests": 0, "queued_items": 0,
            "inflight_batches": 0, "open_requests": 0, "replicas": 1, "replica_deaths": 0,
            "retried_batches": 0, "by_size": by_size, "by_reason": {"full": batches},
            "compute_s_by_size": {k: 0.001 * v for k, v in by_size.items()},
            "success": {"count": ok, "s": 0.5}, "fail": {"count": 0, "s": 0.0},
            "queue": {"count": ok, "s": 0.1}, "last_inference_ms": ok,
            "latency_model": {}, "replica_info": [{"index": 0}]}


def test_merge_adds_counts_and_keeps_every_replica():
    a = shard_stats(2, 10, {4: 1, 6: 1}, 3)
    b = shard_stats(1, 4, {4: 1}, 2)
    m = merge_stats([a, b])
    assert (m["batches"], m["items"], m["replicas"], m["shards"]) == (3, 14, 2, 2)
    assert m["by_size"] == {4: 2, 6: 1} and m["by_reason"] == {"full": 3}
    assert m["success"] == {"count": 5, "s": 1.0}
    assert m["mean_batch_size"] == round(14 / 3, 3)
    assert len(m["replica_info"]) == 2 and m["last_inference_ms"] == 3
    counters = model_counters(m)
    assert counters.execution_count == 3 and counters.inference_count == 14
    assert {b.batch_size: b.compute_infer.count for b in counters.batch_stats} == {4: 2, 6: 1}
    assert merge_stats([a]) is a


def test_merge_adds_the_queue_wait_buckets_of_the_shards():
    a = {**shard_stats(1, 1, {1: 1}, 1), "queue_hist": [1, 0, 2]}
    b = {**shard_stats(1, 1, {1: 1}, 1), "queue_hist": [0, 3, 1]}
    assert merge_stats([a, b])["queue_hist"] == [1, 3, 3]
    assert "queue_hist" not in merge_stats([shard_stats(1, 1, {1: 1}, 1)] * 2)


def test_each_shard_runs_its_share_of_the_replicas_rounded_up():
    cfg = load_config({"models": [{
        "name": "m", "transformer": "deployments.models:Square",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1]}],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1]}],
        "replicas": {"min_replicas": 3, "max_replicas": 5}, "batcher": {"shards": 2}}]})
    share = shard_config(cfg.models[0]).replicas
    assert (share.min_replicas, share.max_replicas) == (2, 3)


def test_each_ingress_replica_of_an_ingress_placed_model_owns_its_share():
    from deployments.ingress.placement import replica_share

    cfg = load_config({"models": [{
        "name": "m", "transformer": "deployments.models:Square",
        "inputs": [{"name": "x", "datatype": "FP32", "shape": [-1]}],
        "outputs": [{"name": "y", "datatype": "FP32", "shape": [-1]}],
        "replicas": {"min_replicas": 3, "max_replicas": 5}, "batcher": {"placement": "ingress"}}]})
    share = replica_share(cfg.models[0], 2).replicas
    assert (share.min_replicas, share.max_replicas) == (2, 3)
    assert replica_share(cfg.models[0], 1).replicas == cfg.models[0].replicas
