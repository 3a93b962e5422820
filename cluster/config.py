"""The one configuration file: models, their batching policy, replicas, and the ingress.

Everything Raybatch deploys or renders (the Serve application, `serve build`
output, RayService manifests, dashboards) is derived from a `RaybatchConfig`, so
there is one place to change a setting. Validation happens once, here, with
messages that name the field, the value and the fix.

    models:
      - name: mlp
        transformer: deployments.models:MLP
        inputs:  [{name: INPUT0, datatype: FP32, shape: [-1, 256]}]
        outputs: [{name: OUTPUT0, datatype: FP32, shape: [-1, 256]}]
        batching: {max_batch_size: 64, max_queue_delay_s: 0.002}
        replicas: {min_replicas: 1, max_replicas: 2, num_cpus: 1}
"""

from __future__ import annotations

import importlib
import os
import re
from pathlib import Path
from typing import Annotated, Any, Literal

import yaml
from pydantic import (
    BaseModel,
    ConfigDict,
    Discriminator,
    Field,
    Tag,
    ValidationError,
    field_validator,
    model_validator,
)

from batching.dynamic.policy import DynamicPolicy
from batching.iterative.policy import IterativePolicy
from batching.sequence.policy import SequencePolicy
from cluster.k8s.settings import KubernetesConfig

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
DATATYPES = ("BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64",
             "FP16", "FP32", "FP64", "BYTES")


# Import paths users wrote that have moved: the new home, named in the error.
MOVED_MODULES = {
    "deployments.stateful_models": "deployments.models",
    "deployments.tinylm": "deployments.models",
}


class ConfigError(ValueError):
    """A configuration file or value is invalid; the message says where and how to fix it."""


class TensorConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    """Tensor name as clients send it (Triton's INPUT0/OUTPUT0 style)."""
    datatype: str
    """Open Inference Protocol datatype: FP32, INT64, BYTES ..."""
    shape: tuple[int, ...]
    """Shape with the leading batch dimension; -1 for a variable dimension."""

    @field_validator("datatype")
    @classmethod
    def _known(cls, v: str) -> str:
        if v.upper() not in DATATYPES:
            raise ValueError(f"datatype={v!r} is not one of {', '.join(DATATYPES)}")
        return v.upper()

    @field_validator("shape")
    @classmethod
    def _batch_dim(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        if not v or v[0] != -1:
            raise ValueError(f"shape={list(v)} must start with -1, the batch dimension")
        if any(d < -1 or d == 0 for d in v):
            raise ValueError(f"shape={list(v)}: dimensions must be -1 or >= 1")
        return v


class ReplicaConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    min_replicas: int = Field(default=1, ge=0)
    """Replicas kept alive even when idle."""
    max_replicas: int = Field(default=1, ge=1)
    """Most replicas the pool scales up to on queue depth."""
    num_cpus: float = Field(default=1.0, ge=0)
    """CPUs each replica reserves (and, pinned, the cores it gets)."""
    num_gpus: float = Field(default=0.0, ge=0)
    """GPUs each replica reserves; 1 runs the model on `cuda`."""
    max_inflight_batches: int = Field(default=2, ge=1)
    """Batches sent to one replica before its previous ones return (pipelining)."""
    resources: dict[str, float] = Field(default_factory=dict)
    """Extra Ray custom resources per replica (e.g. {"numa0": 2})."""
    env: dict[str, str] = Field(default_factory=dict)
    """Environment variables of the replica process (OMP_NUM_THREADS is set from num_cpus)."""
    scale_up_queue_items: int = Field(default=256, ge=1)
    """Queued items per replica above which the pool adds a replica."""
    scale_down_idle_s: float = Field(default=30.0, gt=0)
    """Seconds with nothing queued or running before the pool removes a replica."""
    pin: Literal["auto", "required", "off"] = "auto"
    """Pin the replica to whole physical cores (floor(num_cpus) of them, SMT siblings
    included) of one NUMA node, or local to its GPU (`cluster.pinning`). `auto`: pin when
    the replica has whole cores and the cluster advertises numa<N> resources (started by
    `raybatch up` / `raybatch join`) or it has a GPU; run unpinned, with a warning, when
    the cores are taken. `required`: pin or fail to start. `off`: never pin."""

    @model_validator(mode="after")
    def _bounds(self) -> ReplicaConfig:
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas={self.min_replicas} exceeds max_replicas="
                             f"{self.max_replicas}: lower min_replicas or raise max_replicas")
        if self.pin == "required" and self.num_cpus < 1:
            raise ValueError(f"pin='required' with num_cpus={self.num_cpus}: a pinned replica "
                             f"takes whole cores; raise num_cpus to >= 1 or set pin to 'auto'")
        return self


class BatcherConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    shards: int = Field(default=1, ge=1)
    """Batching actors for this model; each owns its share of the replicas."""
    num_cpus: float = Field(default=0.0, ge=0)
    """CPUs each batching actor reserves."""


def _policy_kind(value: Any) -> str:
    """The `kind` of a batching block; a block without one is dynamic batching."""
    kind = value.get("kind", "dynamic") if isinstance(value, dict) else getattr(value, "kind",
                                                                                   None)
    return kind if isinstance(kind, str) else "dynamic"  # an unknown one is reported by name


Policy = Annotated[
    Annotated[DynamicPolicy, Tag("dynamic")]
    | Annotated[SequencePolicy, Tag("sequence")]
    | Annotated[IterativePolicy, Tag("iterative")],
    Discriminator(_policy_kind),
]


class ModelConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    """Model name in URLs: /v2/models/{name}/infer."""
    transformer: str
    """Import path of the model class, 'package.module:Class': a VectorTransformer
    (dynamic), a StatefulTransformer (sequence) or a StepModel (iterative)."""
    init_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of the transformer's constructor."""
    version: str = "1"
    inputs: tuple[TensorConfig, ...]
    outputs: tuple[TensorConfig, ...]
    batching: Policy = DynamicPolicy(max_batch_size=64, max_queue_delay_s=0.002)
    """How requests become batches: `kind: dynamic` (the default; stateless models),
    `sequence` (stateful models, sequence_id/start/end) or `iterative` (generative
    models, continuous batching of generation steps)."""
    replicas: ReplicaConfig = ReplicaConfig()
    batcher: BatcherConfig = BatcherConfig()

    @field_validator("name")
    @classmethod
    def _url_safe(cls, v: str) -> str:
        if not _NAME.match(v):
            raise ValueError(f"name={v!r} must be letters, digits, '_', '-', '.' (used in URLs)")
        return v

    @field_validator("transformer")
    @classmethod
    def _import_path(cls, v: str) -> str:
        if ":" not in v:
            raise ValueError(f"transformer={v!r} must look like 'package.module:ClassName'")
        module, _, name = v.partition(":")
        if module in MOVED_MODULES:
            raise ValueError(f"transformer={v!r}: module {module} has moved; write "
                             f"'{MOVED_MODULES[module]}:{name}' instead")
        return v

    @field_validator("inputs", "outputs")
    @classmethod
    def _some(cls, v: tuple[TensorConfig, ...]) -> tuple[TensorConfig, ...]:
        if not v:
            raise ValueError("a model needs at least one tensor here")
        names = [t.name for t in v]
        if len(set(names)) != len(names):
            raise ValueError(f"tensor names {names} repeat: each must be unique")
        return v


class IngressConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    num_replicas: int = Field(default=1, ge=1)
    """Serve replicas of the HTTP/handle ingress."""
    num_cpus: float = Field(default=0.5, ge=0)
    max_body_bytes: int = Field(default=64 * 2**20, ge=1024)
    """Largest request body accepted; larger ones get HTTP 413."""
    route_prefix: str = "/"
    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=1, le=65535)
    default_timeout_s: float | None = Field(default=None, gt=0)
    """Deadline of a request that names none; None: no deadline."""


class RaybatchConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    app_name: str = "raybatch"
    models: tuple[ModelConfig, ...]
    ingress: IngressConfig = IngressConfig()
    kubernetes: KubernetesConfig = KubernetesConfig()
    """Pods, images and autoscaling of `raybatch render k8s` (`cluster.k8s.settings`)."""

    @model_validator(mode="after")
    def _unique(self) -> RaybatchConfig:
        names = [m.name for m in self.models]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"model names {dup} appear more than once: names must be unique")
        return self

    def model(self, name: str) -> ModelConfig:
        """The model named `name`; KeyError if there is none."""
        for m in self.models:
            if m.name == name:
                return m
        raise KeyError(name)


def load_config(source: str | Path | dict) -> RaybatchConfig:
    """A validated config from a YAML file path or an already parsed dict."""
    if isinstance(source, dict):
        data, where = source, "config"
    else:
        path = Path(source)
        try:
            data = yaml.safe_load(path.read_text())
        except FileNotFoundError as e:
            raise ConfigError(f"config file {path} does not exist") from e
        except yaml.YAMLError as e:
            raise ConfigError(f"{path} is not valid YAML: {e}") from e
        where = str(path)
    try:
        return RaybatchConfig.model_validate(data)
    except ValidationError as e:
        lines = [f"{where}: {len(e.errors())} invalid setting(s):"]
        for err in e.errors():
            lines.append("  " + describe_error(err))
        raise ConfigError("\n".join(lines)) from None


DEMO_CONFIG = Path(__file__).resolve().parent.parent / "deployments" / "configs" / "demo.yaml"


def load_default(path: str | Path | None = None) -> RaybatchConfig:
    """The config to deploy: `path` if given, else $RAYBATCH_CONFIG, else the bundled demo."""
    return load_config(path or os.environ.get("RAYBATCH_CONFIG") or DEMO_CONFIG)


_KINDS = ("dynamic", "sequence", "iterative")


def describe_error(err: dict) -> str:
    """One pydantic error as 'where=value: what is wrong'."""
    # A batching block's union tag (dynamic/sequence/iterative) is not a field: drop it.
    parts = [str(p) for i, p in enumerate(err["loc"])
             if not (i and err["loc"][i - 1] == "batching" and p in _KINDS)]
    loc = ".".join(parts)
    if err.get("type") == "union_tag_invalid":
        return f"{loc}.kind={err['ctx']['tag']!r}: must be one of {', '.join(_KINDS)}"
    msg = err["msg"].removeprefix("Value error, ")
    value = err.get("input")
    if isinstance(value, (int, float, str, bool)) and not msg.startswith(loc.split(".")[-1]):
        msg = msg.replace("Input should be", "must be")
        return f"{loc}={value!r}: {msg}"
    return f"{loc}: {msg}"


def import_object(path: str) -> Any:
    """The object named by 'package.module:Name'."""
    module, _, name = path.partition(":")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError) as e:
        raise ConfigError(f"cannot import {path!r}: {e}") from e
