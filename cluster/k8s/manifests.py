"""All the manifests of one config, and the YAML files they are written to.

`render(config)` returns `{file name: [objects]}`: plain dicts, built by the small
functions of `rayservice`, `pods`, `sizing` and `monitoring` (the RayService, its
PodMonitors, and the ConfigMap of the Grafana dashboard that `raybatch dashboard
render` makes of the same config); YAML appears only
in `to_yaml` and `write`, at the edge. `kubectl apply -f DIR` takes the folder.

    files = render(load_config("my.yaml"), image="registry.example.com/raybatch:0.1.0")
    write(files, "k8s/my", source="my.yaml")
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import yaml

from cluster.config import RaybatchConfig
from cluster.grafana.dashboard import render_dashboard
from cluster.k8s.monitoring import INSTANCE_LABEL, dashboard_configmap, podmonitors
from cluster.k8s.rayservice import rayservice
from cluster.k8s.settings import (
    KubernetesConfig,
    check_dns_label,
    check_image,
    check_namespace,
)
from cluster.k8s.sizing import RenderError

RAYSERVICE_FILE = "rayservice.yaml"
PODMONITOR_FILE = "podmonitors.yaml"
DASHBOARD_FILE = "grafana-dashboard.yaml"


def package_version() -> str:
    try:
        return version("raybatch")
    except PackageNotFoundError:  # a source tree that was never installed
        return "dev"


def default_image(gpu: bool = False) -> str:
    """What the Dockerfiles build: `docker build -t raybatch:<version> .` (`-gpu` for GPUs)."""
    return f"raybatch:{package_version()}" + ("-gpu" if gpu else "")


def service_name(config: RaybatchConfig) -> str:
    k8s: KubernetesConfig = config.kubernetes
    try:
        return check_dns_label(k8s.name or config.app_name,
                               "kubernetes.name" if k8s.name else "app_name", 47)
    except ValueError as e:
        raise RenderError(f"{e}; set kubernetes.name to name the RayService") from None


def render(config: RaybatchConfig, *, image: str | None = None, gpu_image: str | None = None,
           namespace: str | None = None) -> dict[str, list[dict[str, Any]]]:
    """The manifests of `config`, by file name. Images: these, else the config's, else
    `default_image()`; the GPU image defaults to the CPU one with `-gpu` appended."""
    k8s: KubernetesConfig = config.kubernetes
    name = service_name(config)
    try:  # what the command line gives (the config's were checked as it loaded)
        for value, what in ((image, "--image"), (gpu_image, "--gpu-image")):
            if value is not None:
                check_image(value, what)
        if namespace is not None:
            check_namespace(namespace)
    except ValueError as e:
        raise RenderError(str(e)) from None
    image = image or k8s.image or default_image()
    gpu_image = gpu_image or k8s.gpu_image or f"{image}-gpu"
    pod_labels = {"app.kubernetes.io/name": "raybatch", INSTANCE_LABEL: name}
    labels = {**pod_labels, "app.kubernetes.io/version": package_version()}
    service = rayservice(config, k8s, name=name, image=image, gpu_image=gpu_image,
                         labels=pod_labels, namespace=namespace)
    service["metadata"]["labels"] = labels
    dashboard = dashboard_configmap(name, render_dashboard(config), labels, namespace)
    return {RAYSERVICE_FILE: [service],
            PODMONITOR_FILE: podmonitors(name, labels, k8s.prometheus_release, namespace),
            DASHBOARD_FILE: [dashboard]}


class _Dumper(yaml.SafeDumper):
    """Block style for multi-line strings (the Serve config reads as YAML in YAML)."""


def _str(dumper: yaml.SafeDumper, value: str) -> yaml.Node:
    style = "|" if "\n" in value else None
    return dumper.represent_scalar("tag:yaml.org,2002:str", value, style=style)


_Dumper.add_representer(str, _str)


def to_yaml(objects: Sequence[Mapping[str, Any]], header: str = "") -> str:
    docs = [yaml.dump(dict(o), Dumper=_Dumper, sort_keys=False, width=100) for o in objects]
    return header + "---\n".join(docs)


def header(source: str | None) -> str:
    """The comment atop each file: what rendered it, from which config (None: the demo)."""
    command = "raybatch render k8s" + (f" --config {source}" if source else "")
    return (f"# Rendered by `{command}` (raybatch {package_version()}).\n"
            f"# Do not edit: change the config and render again.\n")


def write(files: Mapping[str, Sequence[Mapping[str, Any]]], out_dir: str | Path,
          source: str | None) -> list[Path]:
    """Each file of `files` under `out_dir`; returns the paths written."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written = []
    for file_name, objects in files.items():
        path = out / file_name
        path.write_text(to_yaml(objects, header(source)))
        written.append(path)
    return written
