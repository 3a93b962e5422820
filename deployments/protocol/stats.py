"""The batching actor's statistics in the shape of Triton's statistics extension.

Triton counts `inference_count` in items and `execution_count` in batches and
reports compute time per batch size; Raybatch's engine measures one compute
time per batch (pre- and post-processing included), reported as
`compute_infer`.
"""

from __future__ import annotations

from typing import Any

from deployments.protocol.metadata import (
    BatchStats,
    DurationStat,
    ModelCounters,
    ModelSpec,
    model_stat_json,
)

_SUMMED = ("batches", "items", "queued_requests", "queued_items", "inflight_batches",
           "open_requests", "replicas", "replica_deaths", "retried_batches")
_COUNTERS = ("by_size", "by_reason", "compute_s_by_size")
_DURATIONS = ("success", "fail", "queue")
_NONE = {"count": 0, "s": 0.0}


def merge_stats(shards: list[dict[str, Any]]) -> dict[str, Any]:
    """One model's statistics from those of its batching shards (one shard: unchanged)."""
    if len(shards) == 1:
        return shards[0]
    out: dict[str, Any] = {k: sum(s.get(k, 0) for s in shards) for k in _SUMMED}
    out["batch_limit"] = shards[0].get("batch_limit")  # per batch: the same in every shard
    for k, v in shards[0].items():  # counters of the other engines (live_sequences, steps...)
        if k not in out and isinstance(v, (int, float)) and not isinstance(v, bool):
            out[k] = sum(s.get(k, 0) for s in shards)
    for k in _COUNTERS:
        merged: dict[Any, float] = {}
        for s in shards:
            for key, v in s.get(k, {}).items():
                merged[key] = merged.get(key, 0) + v
        out[k] = merged
    for k in _DURATIONS:
        out[k] = {f: sum(s.get(k, _NONE)[f] for s in shards) for f in ("count", "s")}
    hists = [s["queue_hist"] for s in shards if "queue_hist" in s]
    if hists:
        out["queue_hist"] = [sum(col) for col in zip(*hists)]
    out["mean_batch_size"] = round(out["items"] / out["batches"], 3) if out["batches"] else 0.0
    out["last_inference_ms"] = max(s.get("last_inference_ms", 0) for s in shards)
    out["latency_model"] = [s.get("latency_model") for s in shards]
    out["admission"] = [s.get("admission") for s in shards]
    out["replica_info"] = [r for s in shards for r in s.get("replica_info", [])]
    out["shards"] = len(shards)
    out["kind"] = shards[0].get("kind", "dynamic")
    out["items_by_shard"] = [s.get("items", 0) for s in shards]
    return out


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


def _duration(d: dict[str, Any]) -> DurationStat:
    return DurationStat(d["count"], _ns(d["s"]))


def model_counters(raw: dict[str, Any]) -> ModelCounters:
    by_size = raw.get("by_size", {})
    compute = raw.get("compute_s_by_size", {})
    return ModelCounters(
        last_inference_ms=raw.get("last_inference_ms", 0),
        inference_count=raw.get("items", 0),
        execution_count=raw.get("batches", 0),
        success=_duration(raw.get("success", _NONE)),
        fail=_duration(raw.get("fail", _NONE)),
        queue=_duration(raw.get("queue", _NONE)),
        compute_infer=DurationStat(raw.get("batches", 0), _ns(sum(compute.values()))),
        batch_stats=tuple(
            BatchStats(int(size), compute_infer=DurationStat(count, _ns(compute.get(size, 0.0))))
            for size, count in by_size.items()
        ),
    )


def model_counters_json(spec: ModelSpec, raw: dict[str, Any]) -> dict[str, Any]:
    return model_stat_json(spec.name, spec.version, model_counters(raw))
