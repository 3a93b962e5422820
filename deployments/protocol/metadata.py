"""What a model declares, and the read-only bodies the protocol serves about it.

Decides the model's contract (`TensorSpec`, `ModelSpec`) and renders it the ways
clients ask for it: the Open Inference Protocol metadata (`GET /v2/models/{m}`),
Triton's model configuration (`GET /v2/models/{m}/config`, what tritonclient's
`get_model_config` returns), the server metadata (`GET /v2`) and Triton's
statistics extension (`GET /v2/models/{m}/stats`). Pure: no web framework, no Ray.

Invariant kept by `ModelSpec`: when `max_batch_size > 0` every tensor's leading
dim is the batch dim and is -1, as in Triton's metadata; the configuration drops
it (Triton's `dims` never include the batch dim). Specs are checked once, when
built, with `ValueError`: they are the server's configuration, not a request.
Field names of every body are Triton's, exactly, so its clients parse them.
"""

from __future__ import annotations

import importlib.metadata
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import orjson

from batching.errors import InvalidRequest
from deployments.protocol.datatypes import check_datatype
from deployments.protocol.limits import shown

# Extensions every Raybatch server serves (on HTTP and gRPC alike); `served_extensions`
# adds those that depend on the models. `model_repository`: the index only (no load or
# unload: models are the config's).
DEFAULT_EXTENSIONS = ("binary_tensor_data", "model_repository", "statistics")


def served_extensions(kinds: Iterable[str]) -> tuple[str, ...]:
    """The extensions a server of models of these batching kinds serves: `sequence`
    where a stateful model is served, `generate` where a generative one is.

    >>> served_extensions(["dynamic", "sequence"])
    ('binary_tensor_data', 'model_repository', 'statistics', 'sequence')
    """
    kinds = set(kinds)
    return DEFAULT_EXTENSIONS + tuple(
        ext for kind, ext in (("sequence", "sequence"), ("iterative", "generate"))
        if kind in kinds)


def package_version() -> str:
    """Raybatch's version, as the server metadata reports it."""
    try:
        return importlib.metadata.version("raybatch")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


@dataclass(frozen=True, slots=True)
class TensorSpec:
    """One input or output: OIP datatype and shape, -1 for a variable dim.

    >>> TensorSpec("x", "FP32", [-1, 3]).shape
    (-1, 3)
    """

    name: str
    datatype: str
    shape: tuple[int, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "shape", tuple(self.shape))
        if not self.name:
            raise ValueError("a tensor needs a non-empty name")
        try:
            check_datatype(self.datatype, f"tensor '{self.name}'")
        except InvalidRequest as exc:
            raise ValueError(str(exc)) from None
        bad = [d for d in self.shape if not isinstance(d, int) or d < -1]
        if bad:
            raise ValueError(
                f"tensor '{self.name}' has shape {list(self.shape)}: dims must be "
                f"integers >= 0, or -1 for a variable dim (got {bad})"
            )


@dataclass(frozen=True, slots=True)
class ModelSpec:
    """A model's name, version and tensors; `max_batch_size=0` means no batch dim.

    >>> spec = ModelSpec("m", inputs=[TensorSpec("x", "FP32", [-1, 3])],
    ...                  outputs=[TensorSpec("y", "FP32", [-1])], max_batch_size=8)
    >>> spec.input_names
    ('x',)
    """

    name: str
    version: str = "1"
    platform: str = "raybatch"
    inputs: tuple[TensorSpec, ...] = ()
    outputs: tuple[TensorSpec, ...] = ()
    max_batch_size: int = 0
    input_by_name: dict[str, TensorSpec] = field(init=False, repr=False, compare=False)
    """The inputs by name, for the decoder (built once, not per request)."""
    input_names: tuple[str, ...] = field(init=False, repr=False, compare=False)
    output_names: tuple[str, ...] = field(init=False, repr=False, compare=False)
    plans: dict[bytes, Any] = field(init=False, repr=False, compare=False)
    """Binary requests' JSON headers seen before -> how to decode them again
    (`deployments.protocol.plans`); filled only where the caller asks for it."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "inputs", tuple(self.inputs))
        object.__setattr__(self, "outputs", tuple(self.outputs))
        object.__setattr__(self, "input_by_name", {t.name: t for t in self.inputs})
        object.__setattr__(self, "input_names", tuple(t.name for t in self.inputs))
        object.__setattr__(self, "output_names", tuple(t.name for t in self.outputs))
        object.__setattr__(self, "plans", {})
        if not self.inputs or not self.outputs:
            raise ValueError(f"model '{self.name}' needs at least one input and one output")
        if self.max_batch_size < 0:
            raise ValueError(
                f"model '{self.name}': max_batch_size={self.max_batch_size} must be >= 0 "
                "(0: the model takes no batch dim)"
            )
        for kind, tensors in (("input", self.inputs), ("output", self.outputs)):
            names = [t.name for t in tensors]
            if len(set(names)) != len(names):
                raise ValueError(f"model '{self.name}' has duplicate {kind} names: {names}")
            if self.max_batch_size > 0:
                for t in tensors:
                    if not t.shape or t.shape[0] != -1:
                        raise ValueError(
                            f"model '{self.name}' batches (max_batch_size="
                            f"{self.max_batch_size}), so {kind} '{t.name}' needs -1 as its "
                            f"leading (batch) dim; got shape {list(t.shape)}"
                        )


def metadata_json(spec: ModelSpec) -> dict[str, Any]:
    """The OIP model metadata body for `GET /v2/models/{name}`."""
    return {
        "name": spec.name,
        "versions": [spec.version],
        "platform": spec.platform,
        "inputs": [_tensor_metadata(t) for t in spec.inputs],
        "outputs": [_tensor_metadata(t) for t in spec.outputs],
    }


def _tensor_metadata(t: TensorSpec) -> dict[str, Any]:
    return {"name": t.name, "datatype": t.datatype, "shape": list(t.shape)}


def model_config_json(spec: ModelSpec, extra: Mapping[str, Any] | None = None) -> dict[str, Any]:
    """Triton's model configuration JSON (`GET /v2/models/{name}/config`).

    `dims` leave out the batch dim; BYTES is Triton's `TYPE_STRING`. `extra` is
    merged in at the top level, e.g. `{"dynamic_batching": {...}}`.
    """
    skip = 1 if spec.max_batch_size > 0 else 0
    config: dict[str, Any] = {
        "name": spec.name,
        "platform": spec.platform,
        "backend": spec.platform,
        "max_batch_size": spec.max_batch_size,
        "input": [
            {**_config_tensor(t, skip), "format": "FORMAT_NONE", "optional": False}
            for t in spec.inputs
        ],
        "output": [_config_tensor(t, skip) for t in spec.outputs],
    }
    config.update(extra or {})
    return config


def _config_tensor(t: TensorSpec, skip: int) -> dict[str, Any]:
    data_type = "TYPE_STRING" if t.datatype == "BYTES" else f"TYPE_{t.datatype}"
    return {"name": t.name, "data_type": data_type, "dims": list(t.shape[skip:])}


def repository_index_json(models: Iterable[tuple[str, str, bool]],
                          ready_only: bool = False) -> list[dict[str, str]]:
    """Triton's repository index (`POST /v2/repository/index`, gRPC `RepositoryIndex`):
    each served model's name, version and state, from (name, version, ready) triples;
    `ready_only` keeps the ready ones (the request's `"ready": true`).

    >>> repository_index_json([("a", "1", True), ("b", "1", False)], ready_only=True)
    [{'name': 'a', 'version': '1', 'state': 'READY'}]
    """
    return [{"name": name, "version": version, "state": "READY" if ready else "UNAVAILABLE"}
            for name, version, ready in models if ready or not ready_only]


def read_index_request(body: bytes) -> bool:
    """The `ready` filter of a repository index request body (empty: no filter)."""
    if not body.strip():
        return False
    try:
        doc = orjson.loads(body)
    except orjson.JSONDecodeError:
        doc = body  # shown as it came
    if not isinstance(doc, dict) or set(doc) - {"ready"}:
        raise InvalidRequest('a repository index body is empty or {"ready": true|false}, '
                             f"got {shown(doc)}")
    ready = doc.get("ready", False)
    if not isinstance(ready, bool):
        raise InvalidRequest(f"'ready' must be true or false, got {shown(ready)}")
    return ready


def server_metadata_json(
    name: str = "raybatch",
    version: str | None = None,
    extensions: Sequence[str] = DEFAULT_EXTENSIONS,
) -> dict[str, Any]:
    """The OIP server metadata body for `GET /v2`; version defaults to the package's."""
    if version is None:
        version = package_version()
    return {"name": name, "version": version, "extensions": list(extensions)}


@dataclass(frozen=True, slots=True)
class DurationStat:
    """Triton's `$duration_stat`: how many times, and their total nanoseconds."""

    count: int = 0
    ns: int = 0

    def as_json(self) -> dict[str, int]:
        return {"count": self.count, "ns": self.ns}


@dataclass(frozen=True, slots=True)
class BatchStats:
    """Model executions of one batch size (Triton's `$batch_stats`)."""

    batch_size: int
    compute_input: DurationStat = DurationStat()
    compute_infer: DurationStat = DurationStat()
    compute_output: DurationStat = DurationStat()


@dataclass(frozen=True, slots=True)
class ModelCounters:
    """Cumulative counters of one model version, as Triton's statistics report them.

    `inference_count` counts items (a request of batch 64 adds 64),
    `execution_count` counts model executions (batches); `last_inference_ms` is
    milliseconds since the epoch, 0 before the first inference.
    """

    last_inference_ms: int = 0
    inference_count: int = 0
    execution_count: int = 0
    success: DurationStat = DurationStat()
    fail: DurationStat = DurationStat()
    queue: DurationStat = DurationStat()
    compute_input: DurationStat = DurationStat()
    compute_infer: DurationStat = DurationStat()
    compute_output: DurationStat = DurationStat()
    batch_stats: tuple[BatchStats, ...] = field(default=())


def model_stat_json(model_name: str, version: str, counters: ModelCounters) -> dict[str, Any]:
    """One `$model_stat` object; `stats_json` wraps one, an all-models endpoint several."""
    c = counters
    stages = ("compute_input", "compute_infer", "compute_output")
    return {
        "name": model_name,
        "version": version,
        "last_inference": c.last_inference_ms,
        "inference_count": c.inference_count,
        "execution_count": c.execution_count,
        "inference_stats": {
            "success": c.success.as_json(),
            "fail": c.fail.as_json(),
            "queue": c.queue.as_json(),
            **{stage: getattr(c, stage).as_json() for stage in stages},
            # Raybatch has no response cache; Triton reports these as zeros then.
            "cache_hit": DurationStat().as_json(),
            "cache_miss": DurationStat().as_json(),
        },
        "response_stats": {},
        "batch_stats": [
            {"batch_size": b.batch_size, **{s: getattr(b, s).as_json() for s in stages}}
            for b in sorted(c.batch_stats, key=lambda b: b.batch_size)
        ],
        "memory_usage": [],
    }


def stats_json(model_name: str, version: str, counters: ModelCounters) -> dict[str, Any]:
    """Triton's statistics body for `GET /v2/models/{name}/stats`."""
    return {"model_stats": [model_stat_json(model_name, version, counters)]}
