"""The batching actor's statistics in the shape of Triton's statistics extension.

Triton counts `inference_count` in items and `execution_count` in batches and
reports compute time per batch size; Raybatch's engine measures one compute
time per batch (pre- and post-processing included), reported as
`compute_infer`.
"""

from __future__ import annotations

from typing import Any

from deployments.protocol_metadata import (
    BatchStats,
    DurationStat,
    ModelCounters,
    ModelSpec,
    model_stat_json,
)


def _ns(seconds: float) -> int:
    return int(seconds * 1e9)


def model_counters(raw: dict[str, Any]) -> ModelCounters:
    by_size = raw.get("by_size", {})
    compute = raw.get("compute_s_by_size", {})
    return ModelCounters(
        last_inference_ms=raw.get("last_inference_ms", 0),
        inference_count=raw.get("items", 0),
        execution_count=raw.get("batches", 0),
        success=DurationStat(raw["success"]["count"], _ns(raw["success"]["s"])),
        fail=DurationStat(raw["fail"]["count"], _ns(raw["fail"]["s"])),
        queue=DurationStat(raw["queue"]["count"], _ns(raw["queue"]["s"])),
        compute_infer=DurationStat(raw.get("batches", 0), _ns(sum(compute.values()))),
        batch_stats=tuple(
            BatchStats(int(size), compute_infer=DurationStat(count, _ns(compute.get(size, 0.0))))
            for size, count in by_size.items()
        ),
    )


def model_counters_json(spec: ModelSpec, raw: dict[str, Any]) -> dict[str, Any]:
    return model_stat_json(spec.name, spec.version, model_counters(raw))
