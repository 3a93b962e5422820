"""The `kubernetes:` block of the config: pod sizes, images and autoscaling of a RayService.

Everything else in the manifests is derived from the rest of the config (what the
models ask for), so this block only says what Kubernetes cannot know: how big a
pod of each kind is, which image runs, how long an idle pod lives. Every field
has a default, so any config renders.

    kubernetes:
      cpu_workers: [{name: cpu, cpus: 8, memory: 16Gi, threads_per_core: 2}]
      gpu_workers: {cpus: 8, memory: 32Gi, gpus: 1}
      idle_timeout_s: 120
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

# A Kubernetes resource quantity ("8Gi", "512Mi", "1.5"), as the CRDs' own pattern has it.
QUANTITY = re.compile(r"^(\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))(([KMGTPE]i)|[numkMGTPE]|"
                      r"([eE](\+|-)?(([0-9]+(\.[0-9]*)?)|(\.[0-9]+))))?$")
# RFC 1035 label: what KubeRay requires of RayService and worker group names.
DNS_LABEL = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")
MAX_NAME_CHARS = 47  # KubeRay: a RayService name leaves room for its clusters' suffix


def check_dns_label(value: str, what: str, max_chars: int = 63) -> str:
    if not DNS_LABEL.match(value) or len(value) > max_chars:
        raise ValueError(f"{what}={value!r} is not a valid Kubernetes name: lowercase letters, "
                         f"digits and '-', starting with a letter, at most {max_chars} "
                         f"characters (e.g. {_suggest(value)!r})")
    return value


# An image reference as the registries' grammar has it (distribution/reference): an
# optional registry host[:port]/, lowercase path components, an optional :tag and @digest.
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_HOST_PART = r"[a-zA-Z0-9](?:[a-zA-Z0-9-]*[a-zA-Z0-9])?"
_DOMAIN = rf"{_HOST_PART}(?:\.{_HOST_PART})*"
IMAGE = re.compile(rf"^(?:{_DOMAIN}(?::[0-9]+)?/)?{_COMPONENT}(?:/{_COMPONENT})*"
                   r"(?::[\w][\w.-]{0,127})?(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*"
                   r":[0-9a-fA-F]{32,})?$")
NAMESPACE = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")


def check_image(value: str, what: str) -> str:
    if len(value) > 255 or not IMAGE.match(value):
        raise ValueError(f"{what}={value!r} is not an image reference: [registry[:port]/]"
                         "name[:tag][@digest], lowercase path (e.g. "
                         "'registry.example.com/raybatch:0.1.0')")
    return value


def check_namespace(value: str) -> str:
    if len(value) > 63 or not NAMESPACE.match(value):
        raise ValueError(f"namespace {value!r} is not a Kubernetes namespace: lowercase "
                         "letters, digits and '-', starting and ending with a letter or digit, "
                         "at most 63 characters")
    return value


def _suggest(value: str) -> str:
    name = re.sub(r"[^a-z0-9-]+", "-", value.lower()).strip("-")
    return (name if name[:1].isalpha() else f"rb-{name}")[:MAX_NAME_CHARS].rstrip("-") or "raybatch"


def _quantity(value: str, what: str) -> str:
    if not QUANTITY.match(value):
        raise ValueError(f"{what}={value!r} is not a Kubernetes quantity (e.g. '8Gi', '512Mi')")
    return value


class HeadPod(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    cpus: int = Field(default=2, ge=1, le=8192)
    """CPUs of the head pod (requests = limits). Ray sees none (`num-cpus: 0`): no replica
    runs there; the GCS, the Serve controller and proxy, and the 0-CPU batching actors do."""
    memory: str = "8Gi"
    """Memory of the head pod, a Kubernetes quantity."""

    @field_validator("memory")
    @classmethod
    def _memory(cls, v: str) -> str:
        return _quantity(v, "memory")


class CpuWorkers(BaseModel):
    """One worker group of CPU pods."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: str = "cpu"
    """The worker group's name (`groupName`), a DNS label."""
    cpus: int = Field(default=4, ge=1, le=8192)
    """CPUs of each pod: its requests and limits (whole CPUs, so a kubelet with the static
    CPU manager gives it exclusive cores) and Ray's `num-cpus`. At most 8,192, the most a
    Linux kernel runs on."""
    memory: str = "8Gi"
    """Memory of each pod (requests = limits), a Kubernetes quantity."""
    threads_per_core: int = Field(default=1, ge=1, le=8)
    """Logical CPUs per physical core on the nodes these pods run on (2 with SMT, as on
    most cloud VMs): `numa<N>` counts physical cores, as `raybatch join` does."""
    numa_nodes: int = Field(default=1, ge=1, le=1024)
    """NUMA nodes a pod's cores span (1 with the topology manager's single-numa-node
    policy); the pod advertises `numa0` .. `numa<numa_nodes-1>`, its cores split evenly.
    At most 1,024, the most a Linux kernel knows."""
    node_selector: dict[str, str] = Field(default_factory=dict)
    """`nodeSelector` of the pods (e.g. a node pool)."""
    tolerations: tuple[dict[str, Any], ...] = ()
    """`tolerations` of the pods, as Kubernetes writes them."""

    @field_validator("name")
    @classmethod
    def _name(cls, v: str) -> str:
        return check_dns_label(v, "name")

    @field_validator("memory")
    @classmethod
    def _memory(cls, v: str) -> str:
        return _quantity(v, "memory")

    @model_validator(mode="after")
    def _whole_cores(self) -> CpuWorkers:
        per = self.threads_per_core * self.numa_nodes
        if self.cpus % per:
            raise ValueError(f"cpus={self.cpus} is not whole cores on {self.numa_nodes} NUMA "
                             f"node(s) of {self.threads_per_core} thread(s) per core: make it "
                             f"a multiple of {per}")
        return self

    @property
    def cores_per_numa_node(self) -> int:
        return self.cpus // self.threads_per_core // self.numa_nodes


GPU_TOLERATION = {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}


class GpuWorkers(CpuWorkers):
    """The worker group of GPU pods, rendered when a model asks for GPUs."""

    name: str = "gpu"
    cpus: int = Field(default=8, ge=1, le=8192)
    memory: str = "32Gi"
    gpus: int = Field(default=1, ge=1, le=256)
    """GPUs of each pod (its `nvidia.com/gpu` limit) and Ray's `num-gpus` (at most 256)."""
    gpu_resource: str = "nvidia.com/gpu"
    """The extended resource the device plugin advertises."""
    tolerations: tuple[dict[str, Any], ...] = (GPU_TOLERATION,)
    """Default: tolerate the `nvidia.com/gpu` taint GPU node pools carry."""


class KubernetesConfig(BaseModel):
    """What `raybatch render k8s` cannot derive from the models: pods, images, autoscaling."""

    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    name: str | None = None
    """The RayService's name (default: `app_name`), a DNS label of at most 47 characters."""
    image: str | None = None
    """Image of the CPU pods (default: `raybatch:<version>`, what the Dockerfile builds)."""
    gpu_image: str | None = None
    """Image of the GPU pods (default: the CPU image's name with `-gpu` appended)."""

    @field_validator("image", "gpu_image")
    @classmethod
    def _image(cls, v: str | None, info: Any) -> str | None:
        return v if v is None else check_image(v, info.field_name)
    head: HeadPod = HeadPod()
    """The head pod: runs no replica, holds the Serve controller, proxy and batching actors."""
    cpu_workers: tuple[CpuWorkers, ...] = (CpuWorkers(),)
    """CPU worker groups; each model goes to the first one a replica fits in."""
    gpu_workers: GpuWorkers | None = GpuWorkers()
    """The GPU worker group; null: no GPU pods (a model asking for GPUs is then an error)."""
    idle_timeout_s: int = Field(default=60, ge=0, le=2**31 - 1)
    """Seconds a worker pod with nothing running lives before the autoscaler removes it."""
    upscaling_mode: Literal["Default", "Aggressive", "Conservative"] = "Default"
    """How fast the autoscaler adds pods (KubeRay's `upscalingMode`)."""
    prometheus_release: str | None = "prometheus"
    """The `release` label of the PodMonitors (kube-prometheus-stack selects by it);
    null: no such label."""

    @field_validator("name")
    @classmethod
    def _name(cls, v: str | None) -> str | None:
        return None if v is None else check_dns_label(v, "name", MAX_NAME_CHARS)

    @model_validator(mode="after")
    def _unique_groups(self) -> KubernetesConfig:
        names = [g.name for g in self.cpu_workers] + (
            [self.gpu_workers.name] if self.gpu_workers else [])
        if len(set(names)) != len(names):
            raise ValueError(f"worker group names {names} repeat: each must be unique")
        if not self.cpu_workers:
            raise ValueError("cpu_workers is empty: the ingress needs at least one CPU group")
        return self
