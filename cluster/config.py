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

import os
import re
from pathlib import Path
from typing import Annotated, Any

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

from batching.dynamic.policy import DynamicPolicy, QueuePolicy
from batching.iterative.policy import IterativePolicy
from batching.sequence.policy import SequencePolicy

# Parts of the config in modules of their own, re-exported: callers find them here.
from cluster.appsettings import IngressConfig as IngressConfig
from cluster.appsettings import MetricsConfig as MetricsConfig
from cluster.appsettings import stateful_in_one_ingress
from cluster.chat import ChatTemplateConfig as ChatTemplateConfig

# Re-exported: callers have always found these here.
from cluster.configfile import read_yaml
from cluster.k8s.settings import KubernetesConfig
from cluster.modelpath import ConfigError as ConfigError
from cluster.modelpath import import_object as import_object
from cluster.replicas import BatcherConfig as BatcherConfig
from cluster.replicas import ReplicaConfig as ReplicaConfig
from cluster.replicas import group_placement_agrees
from cluster.tensorspec import DATATYPES as DATATYPES
from cluster.tensorspec import RaggedConfig as RaggedConfig
from cluster.tensorspec import TensorConfig as TensorConfig

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


# Import paths users wrote that have moved: the new home, named in the error.
MOVED_MODULES = {
    "deployments.stateful_models": "deployments.models",
    "deployments.tinylm": "deployments.models",
}


class WarmupConfig(BaseModel):
    """Batches a replica runs before it reports ready (Triton's model_warmup)."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    enabled: bool = True
    """Run the warm-up batches; they also check the model's outputs against `outputs`,
    so a class that does not match its declared tensors fails before any traffic."""
    batch_sizes: tuple[int, ...] = ()
    """Batch sizes to run, in order; empty: 1, then the policy's preferred_batch_sizes."""
    count: int = Field(default=1, ge=1)
    """Runs of each batch size."""
    dims: dict[str, tuple[int, ...]] = Field(default_factory=dict)
    """Per input, the sizes of its -1 dims after the batch dim (default: 1 each)."""
    data: dict[str, Any] = Field(default_factory=dict)
    """Per input, one item's value (the input's shape without the batch dim: nested lists
    of numbers, true/false for BOOL, strings for BYTES), repeated to each batch size;
    inputs not named get zeros ("0" for BYTES). The docs' "Warm-up" section has one per
    datatype."""

    @field_validator("batch_sizes")
    @classmethod
    def _positive(cls, v: tuple[int, ...]) -> tuple[int, ...]:
        if any(b < 1 for b in v):
            raise ValueError(f"batch_sizes={list(v)}: every size must be >= 1")
        return v


class LimitsConfig(BaseModel):
    """What one model accepts before it refuses: bounded by default, so overload answers
    429 early instead of growing the batching actor's memory and everyone's latency."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    max_queue_wait_s: float | None = Field(default=1.0, gt=0)
    """Dynamic models: admission by time. A request is refused at once with Overloaded (HTTP
    429, Retry-After from the prediction) only when its predicted wait exceeds this many
    seconds, or its own deadline if sooner: the work in flight and queued ahead of it,
    in full batches, each taking a replica's share of a batch's time (as the engine
    measures it; before it has, the latency model's prediction, first from the replicas'
    warm-up batches; with no batch timed at all, 0.1 s). A burst the replicas serve
    inside it is accepted whatever its size; the count bound is then only a memory guard
    (`guard_batches`). Written into the batching policy unless it sets
    `max_queue_wait_s` itself; None: admission by count (`queue_batches`)."""
    guard_batches: int | None = Field(default=64, ge=1)
    """Dynamic models admitted by time (`max_queue_wait_s`): the count bound that guards
    memory, in batches per replica (guard_batches x max_batch_size x the shard's
    max_replicas requests), far above what the time bound lets wait for all but the
    fastest models. One more is refused with QueueFull (429). Used where the policy sets
    no max_queue_size itself; None: no guard."""
    queue_batches: int | None = Field(default=8, ge=1)
    """Default bound of each batching shard's queue, in batches per replica: at most
    queue_batches x batch size x the shard's max_replicas requests wait (batch size:
    max_batch_size; max_active for generative models; for stateful models it bounds the
    sequence starts waiting for a slot). One more is refused with QueueFull (HTTP 429 with
    Retry-After). Dynamic models use it only with `max_queue_wait_s: null` (else
    `guard_batches`). Used only where the batching policy sets no bound itself
    (max_queue_size, max_pending_sequences); None: unbounded (not recommended)."""
    max_request_items: int | None = Field(default=None, ge=1)
    """Most items (the leading dimension) one request may carry; more is refused with HTTP
    413 before it is queued. None: 16 x max_batch_size."""


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
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: str
    """Model name in URLs: /v2/models/{name}/infer."""
    transformer: str
    """Import path of the model class, 'package.module:Class': a VectorTransformer
    (dynamic), a StatefulTransformer (sequence) or a StepModel (iterative)."""
    init_kwargs: dict[str, Any] = Field(default_factory=dict)
    """Keyword arguments of the transformer's constructor."""
    version: str = "1"
    """Model version in URLs (/v2/models/{name}/versions/{version}/...)."""
    inputs: tuple[TensorConfig, ...]
    """Named input tensors; the leading dim of each is the batch dim."""
    outputs: tuple[TensorConfig, ...]
    """Named output tensors, one row per item each (fields as for inputs)."""
    batching: Policy = DynamicPolicy(max_batch_size=64, max_queue_delay_s=0.002)
    """How requests become batches: `kind: dynamic` (the default; stateless models),
    `sequence` (stateful models, sequence_id/start/end) or `iterative` (generative
    models, continuous batching of generation steps)."""
    replicas: ReplicaConfig = ReplicaConfig()
    """The model's replica pool: counts, resources, pinning, in process or actors."""
    batcher: BatcherConfig = BatcherConfig()
    """Where the model's engine runs, and its batching actors."""
    warmup: WarmupConfig = WarmupConfig()
    """Batches each replica runs before it reports ready (dynamic models)."""
    limits: LimitsConfig = LimitsConfig()
    """What one model accepts before it refuses (bounded by default)."""
    chat_template: ChatTemplateConfig = ChatTemplateConfig()
    """Generative models: how /v1/chat/completions turns messages into the prompt."""

    @property
    def batch_size(self) -> int:
        """Most requests one batch (or generation step) carries."""
        policy = self.batching
        return getattr(policy, "max_batch_size", None) or policy.max_active  # type: ignore

    @property
    def max_request_items(self) -> int:
        """Most items one request may carry (`limits.max_request_items`, or its default)."""
        return self.limits.max_request_items or 16 * self.batch_size

    @property
    def batcher_num_cpus(self) -> float:
        """CPUs each batching actor asks Ray for: its own and its in-process replicas';
        0 when the engine runs in the ingress (there is no batching actor)."""
        if self.batcher.placement != "actor":
            return 0.0
        return self.batcher.num_cpus + self.replicas.host_cpus(self.batcher.shards)

    def bounded(self) -> ModelConfig:
        """This config with the default queue bounds written into its batching policy where
        it has none of its own: for a dynamic model the wait bound
        (`limits.max_queue_wait_s`) and, with it, the count guard (`limits.guard_batches`);
        else the count bound (`limits.queue_batches`)."""
        limits, policy = self.limits, self.batching
        batches = limits.queue_batches
        if isinstance(policy, DynamicPolicy):
            if policy.max_queue_wait_s is None and limits.max_queue_wait_s is not None:
                policy = policy.model_copy(update={"max_queue_wait_s": limits.max_queue_wait_s})
            if policy.max_queue_wait_s is not None:
                batches = limits.guard_batches
        if batches is None:
            return self.model_copy(update={"batching": policy})
        per_replica = getattr(policy, "sequences_per_replica", self.batch_size)
        bound = batches * per_replica * max(self.replicas.max_replicas, 1)
        if isinstance(policy, SequencePolicy):
            if policy.max_pending_sequences is None:
                policy = policy.model_copy(update={"max_pending_sequences": bound})
        elif isinstance(policy, IterativePolicy):
            if policy.max_queue_size is None:
                policy = policy.model_copy(update={"max_queue_size": bound})
        else:
            policy = _bound_levels(policy, bound)
        return self.model_copy(update={"batching": policy})

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

    @model_validator(mode="before")
    @classmethod
    def _default_placement(cls, data: Any) -> Any:
        """A model that names no `batcher.placement` gets the fastest that fits its kind."""
        if not isinstance(data, dict):
            return data
        batcher = data.get("batcher")
        batcher = dict(batcher) if isinstance(batcher, dict) else batcher
        if batcher is not None and not isinstance(batcher, dict):
            return data  # a BatcherConfig already: its placement is set
        batcher = batcher or {}
        if "placement" not in batcher:
            stateless = _policy_kind(data.get("batching", {})) == "dynamic"
            one_shard = batcher.get("shards", 1) == 1
            replicas = data.get("replicas") or {}
            gpus = (replicas.get("num_gpus", 0) if isinstance(replicas, dict)
                    else getattr(replicas, "num_gpus", 0))
            # GPU replicas are shared by every ingress replica, never one pool each
            fast = stateless and one_shard and not (isinstance(gpus, (int, float)) and gpus > 0)
            batcher["placement"] = "ingress" if fast else "actor"
            data = {**data, "batcher": batcher}
        return data

    @model_validator(mode="after")
    def _placement(self) -> ModelConfig:
        if self.batcher.group is not None and (
                self.batcher.placement != "actor" or self.batcher.shards != 1
                or self.batching.kind != "dynamic"):
            raise ValueError(
                f"batcher.group={self.batcher.group!r}: only dynamic models with "
                "batcher.placement='actor' and one shard share a batching actor; drop group, "
                "or set placement to 'actor' and shards to 1")
        self.batcher.check_placed(self.name)
        if self.batcher.placement != "ingress":
            return self
        if self.batcher.shards != 1:
            raise ValueError(
                f"batcher.shards={self.batcher.shards} with batcher.placement='ingress': each "
                "ingress replica already runs its own engine; drop shards or set placement "
                "to 'actor'")
        return self

    @field_validator("inputs", "outputs")
    @classmethod
    def _some(cls, v: tuple[TensorConfig, ...]) -> tuple[TensorConfig, ...]:
        if not v:
            raise ValueError("a model needs at least one tensor here")
        names = [t.name for t in v]
        if len(set(names)) != len(names):
            raise ValueError(f"tensor names {names} repeat: each must be unique")
        return v

    @model_validator(mode="after")
    def _model_shape(self) -> ModelConfig:
        ragged = [t.name for t in self.inputs if t.ragged is not None]
        if ragged and self.batching.kind != "dynamic":
            raise ValueError(f"inputs {ragged} are ragged, which only dynamic (stateless) "
                             f"models support; this one is {self.batching.kind}")
        names = {t.name for t in self.inputs}
        for where, keys in (("dims", self.warmup.dims), ("data", self.warmup.data)):
            unknown = sorted(set(keys) - names)
            if unknown:
                raise ValueError(f"warmup.{where} names {unknown}, which are not inputs of "
                                 f"this model: use {sorted(names)}")
        return self


def _bound_levels(policy: DynamicPolicy, bound: int) -> DynamicPolicy:
    def fill(q: QueuePolicy) -> QueuePolicy:
        return q if q.max_queue_size is not None else q.model_copy(
            update={"max_queue_size": bound})

    return policy.model_copy(update={
        "default_queue_policy": fill(policy.default_queue_policy),
        "priority_queue_policy": {k: fill(q) for k, q in policy.priority_queue_policy.items()},
    })


class RaybatchConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    app_name: str = "raybatch"
    """Serve application name (the Grafana dashboard's uid is derived from it)."""
    models: tuple[ModelConfig, ...]
    """The models served, each with its batching, replicas and tensors."""
    ingress: IngressConfig = IngressConfig()
    """The app's front: ports, request limits, the own HTTP server's bounds, logging."""
    metrics: MetricsConfig = MetricsConfig()
    """Raybatch's Prometheus series (through Ray's metrics export)."""
    python_path: tuple[str, ...] = ()
    """Folders holding your models' modules, put on sys.path in every Raybatch process
    (relative ones are relative to the config file). On a cluster they must exist on
    every node, e.g. in the image."""
    kubernetes: KubernetesConfig = KubernetesConfig()
    """Pods, images and autoscaling of `raybatch render k8s` (`cluster.k8s.settings`)."""

    @model_validator(mode="after")
    def _unique(self) -> RaybatchConfig:
        names = [m.name for m in self.models]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"model names {dup} appear more than once: names must be unique")
        group_placement_agrees(self.models)
        return self

    @model_validator(mode="after")
    def _sequences_in_one_ingress(self) -> RaybatchConfig:
        stateful_in_one_ingress(self.ingress, [m.name for m in self.models if m.batcher.placement
                                               == "ingress" and m.batching.kind == "sequence"])
        return self

    @model_validator(mode="after")
    def _gpu_replicas_not_multiplied(self) -> RaybatchConfig:
        n = self.ingress.num_replicas
        for m in self.models:
            r = m.replicas
            if m.batcher.placement != "ingress" or not r.num_gpus or n == 1:
                continue
            for field, want in (("min_replicas", r.min_replicas), ("max_replicas",
                                                                    r.max_replicas)):
                got = n * -(-want // n)
                if got != want:
                    raise ValueError(
                        f"model {m.name!r} has GPU replicas (num_gpus={r.num_gpus:g}) and "
                        f"batcher.placement='ingress' with ingress.num_replicas={n}: each "
                        f"ingress replica would own its own {-(-want // n)}, {n} x "
                        f"{-(-want // n)} = {got} GPU replicas for {field}={want}; set "
                        "batcher.placement to 'actor' (one pool shared by every ingress "
                        f"replica), or make {field} a multiple of {n}")
        return self

    @property
    def ingress_num_cpus(self) -> float:
        """CPUs each ingress replica asks Ray for: its own (`ingress.num_cpus`) and those
        of the in-process replicas of the models whose engine it runs."""
        parts = self.ingress.num_replicas
        return self.ingress.num_cpus + sum(m.replicas.host_cpus(parts) for m in self.models
                                           if m.batcher.placement == "ingress")

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
        data = read_yaml(path)
        where = str(path)
    try:
        config = RaybatchConfig.model_validate(data)
    except ValidationError as e:
        lines = [f"{where}: {len(e.errors())} invalid setting(s):"]
        for err in e.errors():
            lines.append("  " + describe_error(err))
        raise ConfigError("\n".join(lines)) from None
    if isinstance(source, dict) or not config.python_path:
        return config
    base = Path(source).resolve().parent  # relative folders are relative to the file
    paths = tuple(str((base / p).resolve()) for p in config.python_path)
    return config.model_copy(update={"python_path": paths})


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
