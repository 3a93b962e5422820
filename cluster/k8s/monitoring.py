"""Prometheus scraping and the Grafana dashboard of a Raybatch RayService.

Two PodMonitors, as KubeRay's `config/prometheus/podMonitor.yaml` has them: the
workers' `metrics` port, and the head's `metrics`, `as-metrics` (autoscaler) and
`dash-metrics` (dashboard) ports, each series labelled `ray_io_cluster` with the
pod's `ray.io/cluster`. (No `jobLabel`: it names a pod label to read the job name
from, and Ray pods carry none.) They select this RayService's pods by the
`app.kubernetes.io/instance` label every pod template carries, so they keep
scraping across upgrades (each brings a RayCluster of another name), and live in
its namespace. Prometheus must be told to watch it (kube-prometheus-stack: its
`podMonitorSelector` matches the `release` label).

The dashboard goes in a ConfigMap that Grafana's sidecar loads
(`grafana_dashboard: "1"`): `dashboard_configmap` takes the rendered dashboard
as a dict and writes it one value a line, without padding (a demo config's is
~100 KB, a 14-model config's ~210 KB); past the 1 MiB a ConfigMap may hold it
is refused with the fix.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from cluster.k8s.sizing import RenderError

PODMONITOR_API = "monitoring.coreos.com/v1"
INSTANCE_LABEL = "app.kubernetes.io/instance"
GRAFANA_SIDECAR_LABEL = "grafana_dashboard"
CONFIGMAP_MAX_BYTES = 1024 * 1024  # what the API server accepts in one ConfigMap's data
HEAD_METRIC_PORTS = ("metrics", "as-metrics", "dash-metrics")


def _cluster_relabel() -> list[dict[str, Any]]:
    return [{"action": "replace", "sourceLabels": ["__meta_kubernetes_pod_label_ray_io_cluster"],
             "targetLabel": "ray_io_cluster"}]


def podmonitor(name: str, node_type: str, metric_ports: tuple[str, ...],
               labels: Mapping[str, str], namespace: str | None = None) -> dict[str, Any]:
    """Scrape `metric_ports` of the `node_type` (head / worker) pods of RayService `name`."""
    metadata: dict[str, Any] = {"name": f"{name}-{node_type}s", "labels": dict(labels)}
    if namespace:
        metadata["namespace"] = namespace
    selector = {"matchLabels": {INSTANCE_LABEL: name, "ray.io/node-type": node_type}}
    return {"apiVersion": PODMONITOR_API, "kind": "PodMonitor", "metadata": metadata,
            "spec": {"selector": selector,
                     "podMetricsEndpoints": [{"port": p, "relabelings": _cluster_relabel()}
                                             for p in metric_ports]}}


def podmonitors(name: str, labels: Mapping[str, str], release: str | None,
                namespace: str | None = None) -> list[dict[str, Any]]:
    labels = {**labels, **({"release": release} if release else {})}
    return [podmonitor(name, "head", HEAD_METRIC_PORTS, labels, namespace),
            podmonitor(name, "worker", ("metrics",), labels, namespace)]


def dashboard_configmap(name: str, dashboard: Mapping[str, Any], labels: Mapping[str, str],
                        namespace: str | None = None) -> dict[str, Any]:
    """The Grafana dashboard `dashboard` (its JSON model) in a ConfigMap the sidecar loads."""
    metadata: dict[str, Any] = {"name": f"{name}-dashboard",
                                "labels": {**labels, GRAFANA_SIDECAR_LABEL: "1"}}
    if namespace:
        metadata["namespace"] = namespace
    text = json.dumps(dict(dashboard), indent=1, separators=(",", ":"), sort_keys=True) + "\n"
    if len(text.encode()) > CONFIGMAP_MAX_BYTES:
        raise RenderError(f"the Grafana dashboard of {name!r} is {len(text.encode())} bytes, "
                          f"more than a ConfigMap holds ({CONFIGMAP_MAX_BYTES}): split the "
                          "models over several apps (configs), or publish the dashboard "
                          "with `raybatch dashboard publish` instead")
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": metadata,
            "data": {f"{name}.json": text}}
