"""The pods of a Raybatch RayService: containers, ports, resources, security, node identity.

Small pure functions from settings to the dicts Kubernetes reads. The rules they keep:
- every container runs as the Ray image's non-root user (uid 1000), with no privilege
  escalation, every capability dropped and the runtime's seccomp profile (the
  "restricted" Pod Security Standard), the autoscaler sidecar included;
- worker pods request exactly their limits (Guaranteed QoS, whole CPUs: a kubelet with
  the static CPU manager then gives them exclusive cores to pin replicas to);
- a worker pod tells Ray what `raybatch join` would say of a machine of its size: its
  `numa<N>` cores and `raybatch.io/` labels (`cluster.raynode`), computed from a
  description of the pod as a `Topology`. `numa<N>` counts the pod's own NUMA nodes from
  0 (`RAYBATCH_NUMA_LOGICAL=1`), whichever host node the kubelet gives it, so the
  numbers are fixed before the pod exists, as the autoscaler needs them.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from cluster.k8s.settings import CpuWorkers, GpuWorkers, HeadPod
from cluster.pinning import NUMA_LOGICAL_ENV
from cluster.raynode import node_labels, node_resources
from cluster.topology import Core, Gpu, NumaNode, Topology

RAY_UID = 1000  # the `ray` user of the rayproject/ray images (and of our Dockerfiles)
RAY_GID = 100
METRICS_PORT = 8080
DASHBOARD_PORT = 8265
HEAD_PORTS = {"gcs-server": 6379, "dashboard": DASHBOARD_PORT, "client": 10001,
              "metrics": METRICS_PORT, "as-metrics": 44217, "dash-metrics": 44227}
AUTOSCALER_RESOURCES = {"cpu": "500m", "memory": "512Mi"}


def container_security() -> dict[str, Any]:
    return {"allowPrivilegeEscalation": False, "capabilities": {"drop": ["ALL"]},
            "privileged": False, "runAsNonRoot": True}


def pod_security() -> dict[str, Any]:
    return {"runAsNonRoot": True, "runAsUser": RAY_UID, "runAsGroup": RAY_GID,
            "fsGroup": RAY_GID, "seccompProfile": {"type": "RuntimeDefault"}}


def guaranteed(cpus: int, memory: str, extra: Mapping[str, int] | None = None) -> dict[str, Any]:
    """requests = limits: Guaranteed QoS."""
    amounts = {"cpu": str(cpus), "memory": memory, **{k: str(v) for k, v in (extra or {}).items()}}
    return {"requests": dict(amounts), "limits": dict(amounts)}


def ports(named: Mapping[str, int]) -> list[dict[str, Any]]:
    return [{"name": name, "containerPort": port, "protocol": "TCP"}
            for name, port in named.items()]


def env_list(env: Mapping[str, str]) -> list[dict[str, str]]:
    return [{"name": k, "value": v} for k, v in sorted(env.items())]


def container(name: str, image: str, resources: dict[str, Any], named_ports: Mapping[str, int],
              env: Mapping[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {"name": name, "image": image, "imagePullPolicy": "IfNotPresent",
                           "ports": ports(named_ports), "resources": resources,
                           "securityContext": container_security()}
    if env:
        out["env"] = env_list(env)
    return out


def pod_template(main: dict[str, Any], labels: Mapping[str, str],
                 workers: CpuWorkers | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {"containers": [main], "securityContext": pod_security()}
    if workers is not None and workers.node_selector:
        spec["nodeSelector"] = dict(workers.node_selector)
    if workers is not None and workers.tolerations:
        spec["tolerations"] = [dict(t) for t in workers.tolerations]
    return {"metadata": {"labels": dict(labels)}, "spec": spec}


def head_template(head: HeadPod, image: str, serve_port: int, env: Mapping[str, str],
                  labels: Mapping[str, str]) -> dict[str, Any]:
    main = container("ray-head", image, guaranteed(head.cpus, head.memory),
                     {**HEAD_PORTS, "serve": serve_port}, env)
    return pod_template(main, labels)


def worker_template(workers: CpuWorkers, image: str, env: Mapping[str, str],
                    labels: Mapping[str, str]) -> dict[str, Any]:
    gpus = {workers.gpu_resource: workers.gpus} if isinstance(workers, GpuWorkers) else {}
    main = container("ray-worker", image, guaranteed(workers.cpus, workers.memory, gpus),
                     {"metrics": METRICS_PORT}, {**env, **worker_env(workers)})
    return pod_template(main, labels, workers)


def worker_env(workers: CpuWorkers) -> dict[str, str]:
    """CPU pods count their NUMA nodes from 0 (see the module note); GPU pods pin by GPU."""
    return {} if isinstance(workers, GpuWorkers) else {NUMA_LOGICAL_ENV: "1"}


def pod_topology(workers: CpuWorkers) -> Topology:
    """A pod of `workers` as `cluster.topology` would discover it: whole cores on its
    NUMA nodes (0, 1, ... as the pod counts them), SMT siblings numbered together."""
    per, threads = workers.cores_per_numa_node, workers.threads_per_core
    nodes = tuple(
        NumaNode(n, tuple(Core(tuple(range((n * per + c) * threads, (n * per + c + 1) * threads)),
                               n) for c in range(per)))
        for n in range(workers.numa_nodes))
    gpus = tuple(Gpu(i, f"pod:{i}", 0, nodes[0].cpus) for i in range(getattr(workers, "gpus", 0)))
    return Topology(nodes, gpus)


def numa_resources(workers: CpuWorkers) -> dict[str, int]:
    """`numa<N>` cores of one pod: what `raybatch join` would advertise (none on GPU pods,
    whose replicas pin by GPU: pinned CPU replicas then stay off the costly pods)."""
    if isinstance(workers, GpuWorkers):
        return {}
    return {k: int(v) for k, v in node_resources(pod_topology(workers)).items()}


def ray_labels(workers: CpuWorkers) -> dict[str, str]:
    """The `raybatch.io/` node labels `raybatch join` would give a machine of this pod's size."""
    return node_labels(pod_topology(workers))


def start_params(num_cpus: int, *, num_gpus: int = 0,
                 resources: Mapping[str, int] | None = None) -> dict[str, str]:
    """`rayStartParams`: strings only; custom resources in KubeRay's quoted-JSON form."""
    params = {"num-cpus": str(num_cpus), "metrics-export-port": str(METRICS_PORT)}
    if num_gpus:
        params["num-gpus"] = str(num_gpus)
    if resources:
        params["resources"] = '"' + json.dumps(dict(resources), sort_keys=True).replace(
            '"', '\\"') + '"'
    return params
