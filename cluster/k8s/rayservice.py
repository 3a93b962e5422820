"""The RayService (ray.io/v1): the Serve config of `raybatch build` on an autoscaled RayCluster.

`serveConfigV2` is `cluster.render.serve_config` of the config, with one change:
the ingress listens on every interface (inside a pod, 127.0.0.1 would reach no one;
the pod network is the boundary). Whatever `raybatch build` learns, the manifests
follow. Every Ray container gets Serve's settings in its environment, as `raybatch up`
and `raybatch join` give every node (`cluster.render.serve_environment`: throughput
mode, direct ingress, HAProxy on the Serve port, which answers KubeRay's `/-/healthz`
probes too, and the proxy's ready check), and any `RAY_SERVE_*` the build puts in an
application's environment: Serve's controller and proxies read them when their processes
start, not from the application.

The head runs no replica (`num-cpus: "0"`); worker groups come from
`cluster.k8s.sizing`, their pods from `cluster.k8s.pods`. KubeRay's autoscaler (v2)
adds a pod when a replica is pending and removes one idle for `idle_timeout_s`;
`upgradeStrategy: NewCluster` brings a changed config up on a new cluster and moves
traffic when it is ready.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import yaml

from cluster.config import RaybatchConfig
from cluster.k8s import pods
from cluster.k8s.settings import KubernetesConfig
from cluster.k8s.sizing import GroupPlan, plan_groups
from cluster.raynode import autoscale_labels
from cluster.render import serve_config, serve_environment

SERVE_ENV_PREFIX = "RAY_SERVE_"
ALL_INTERFACES = "0.0.0.0"


def pod_serve_config(config: RaybatchConfig) -> dict[str, Any]:
    """What `raybatch build` renders, listening on every interface of the pod. Without
    Raybatch's own HTTP server (`ingress.native_port`): on Kubernetes the ingress replicas
    land on whichever worker pods Ray picks, and a Service on that port would also send
    connections to pods that hold none; KubeRay's serve Service (Serve's front on every
    pod) is the way in."""
    ingress = config.ingress.model_copy(update={"host": ALL_INTERFACES, "native_port": None})
    return serve_config(config.model_copy(update={"ingress": ingress}))


def serve_process_env(serve: Mapping[str, Any]) -> dict[str, str]:
    """The `RAY_SERVE_*` variables of the Serve config's applications, for every container."""
    env: dict[str, str] = {}
    for app in serve.get("applications", []):
        for key, value in ((app.get("runtime_env") or {}).get("env_vars") or {}).items():
            if key.startswith(SERVE_ENV_PREFIX):
                env[key] = str(value)
    return env


def rayservice(config: RaybatchConfig, k8s: KubernetesConfig, *, name: str, image: str,
               gpu_image: str, labels: Mapping[str, str], namespace: str | None = None,
               ) -> dict[str, Any]:
    serve = pod_serve_config(config)
    env = {**serve_environment(config), **serve_process_env(serve)}
    plans = plan_groups(config, k8s)
    metadata: dict[str, Any] = {"name": name, "labels": dict(labels)}
    if namespace:
        metadata["namespace"] = namespace
    cluster = {
        "rayVersion": ray_version(),
        "enableInTreeAutoscaling": True,
        "autoscalerOptions": autoscaler_options(k8s),
        "headGroupSpec": head_group(config, k8s, plans, image, env, labels),
        "workerGroupSpecs": [worker_group(p, gpu_image if p.gpu else image, env, labels)
                             for p in plans],
    }
    return {"apiVersion": "ray.io/v1", "kind": "RayService", "metadata": metadata,
            "spec": {"upgradeStrategy": {"type": "NewCluster"},
                     "serveConfigV2": yaml.safe_dump(serve, sort_keys=False),
                     "rayClusterConfig": cluster}}


def autoscaler_options(k8s: KubernetesConfig) -> dict[str, Any]:
    amounts = pods.AUTOSCALER_RESOURCES
    return {"version": "v2", "upscalingMode": k8s.upscaling_mode,
            "idleTimeoutSeconds": k8s.idle_timeout_s, "imagePullPolicy": "IfNotPresent",
            "resources": {"requests": dict(amounts), "limits": dict(amounts)},
            "securityContext": pods.container_security()}


def head_group(config: RaybatchConfig, k8s: KubernetesConfig, plans: list[GroupPlan],
               image: str, env: Mapping[str, str], labels: Mapping[str, str]) -> dict[str, Any]:
    group: dict[str, Any] = {
        "rayStartParams": pods.start_params(0),
        "template": pods.head_template(k8s.head, image, config.ingress.port, env, labels),
    }
    hint = autoscale_labels(_largest_numa(plans))
    if hint:
        group["labels"] = hint
    return group


def _largest_numa(plans: list[GroupPlan]) -> dict[str, int]:
    """Per numa<N>, the most cores one pod of a group with pinned replicas advertises."""
    out: dict[str, int] = {}
    for plan in plans:
        if not any(d.ask.cores for d in plan.demands):
            continue
        for key, cores in pods.numa_resources(plan.workers).items():
            out[key] = max(out.get(key, 0), cores)
    return out


def worker_group(plan: GroupPlan, image: str, env: Mapping[str, str],
                 labels: Mapping[str, str]) -> dict[str, Any]:
    w = plan.workers
    params = pods.start_params(w.cpus, num_gpus=getattr(w, "gpus", 0),
                               resources=pods.numa_resources(w))
    return {
        "groupName": w.name,
        "replicas": plan.min_pods,
        "minReplicas": plan.min_pods,
        "maxReplicas": plan.max_pods,
        "rayStartParams": params,
        "labels": pods.ray_labels(w),
        "template": pods.worker_template(w, image, env, labels),
    }


def ray_version() -> str:
    """The Ray this package runs with (the images are built on the same)."""
    from importlib.metadata import version

    return version("ray")
