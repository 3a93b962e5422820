"""The read-only answers of the gRPC service as protos: metadata, model config, statistics.

Built from the same sources as their HTTP twins (the model's config, and the
statistics in the shape of Triton's extension, `deployments.protocol.stats`), with
Triton's proto field names, so `tritonclient.grpc` reads them as it reads
Triton's. The batch dim is left out of a config's `dims`, as Triton does; a
ragged input says `allow_ragged_batch`; a dynamic model's policy appears as its
`dynamic_batching` block, a stateful one's as `sequence_batching`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from tritonclient.grpc import model_config_pb2 as mc
from tritonclient.grpc import service_pb2 as pb

from cluster.config import ModelConfig, TensorConfig
from deployments.protocol.stats import model_counters

PLATFORM = "raybatch"


def model_metadata(config: ModelConfig) -> pb.ModelMetadataResponse:
    def tensor(t: TensorConfig) -> pb.ModelMetadataResponse.TensorMetadata:
        return pb.ModelMetadataResponse.TensorMetadata(name=t.name, datatype=t.datatype,
                                                       shape=list(t.shape))

    return pb.ModelMetadataResponse(
        name=config.name, versions=[config.version], platform=PLATFORM,
        inputs=[tensor(t) for t in config.inputs], outputs=[tensor(t) for t in config.outputs])


def _data_type(datatype: str) -> int:
    return mc.DataType.Value("TYPE_STRING" if datatype == "BYTES" else f"TYPE_{datatype}")


def model_config(config: ModelConfig) -> pb.ModelConfigResponse:
    """Triton's ModelConfig of a Raybatch model."""
    out = mc.ModelConfig(name=config.name, platform=PLATFORM, backend=PLATFORM,
                         max_batch_size=config.batch_size)
    for t in config.inputs:
        out.input.add(name=t.name, data_type=_data_type(t.datatype), dims=list(t.shape[1:]),
                      allow_ragged_batch=t.ragged is not None)
    for t in config.outputs:
        out.output.add(name=t.name, data_type=_data_type(t.datatype), dims=list(t.shape[1:]))
    policy = config.batching
    if policy.kind == "dynamic":
        out.dynamic_batching.preferred_batch_size.extend(policy.preferred_batch_sizes)
        out.dynamic_batching.max_queue_delay_microseconds = round(
            policy.max_queue_delay_s * 1e6)
        out.dynamic_batching.preserve_ordering = policy.preserve_ordering
        out.dynamic_batching.priority_levels = policy.priority_levels
    elif policy.kind == "sequence":
        out.sequence_batching.max_sequence_idle_microseconds = round(
            policy.max_sequence_idle_s * 1e6)
    return pb.ModelConfigResponse(config=out)


def _duration(d: Any) -> pb.StatisticDuration:
    return pb.StatisticDuration(count=d.count, ns=d.ns)


def model_statistics(config: ModelConfig, raw: dict[str, Any]) -> pb.ModelStatistics:
    """One model's statistics (Triton's ModelStatistics) from the batching actors' stats."""
    c = model_counters(raw)
    stats = pb.InferStatistics(
        success=_duration(c.success), fail=_duration(c.fail), queue=_duration(c.queue),
        compute_input=_duration(c.compute_input), compute_infer=_duration(c.compute_infer),
        compute_output=_duration(c.compute_output))
    return pb.ModelStatistics(
        name=config.name, version=config.version, last_inference=c.last_inference_ms,
        inference_count=c.inference_count, execution_count=c.execution_count,
        inference_stats=stats,
        batch_stats=[pb.InferBatchStatistics(batch_size=b.batch_size,
                                             compute_input=_duration(b.compute_input),
                                             compute_infer=_duration(b.compute_infer),
                                             compute_output=_duration(b.compute_output))
                     for b in sorted(c.batch_stats, key=lambda b: b.batch_size)])


def server_metadata(name: str, version: str,
                    extensions: Sequence[str]) -> pb.ServerMetadataResponse:
    """The server's name, version and extensions: what `GET /v2` says too."""
    return pb.ServerMetadataResponse(name=name, version=version, extensions=list(extensions))
