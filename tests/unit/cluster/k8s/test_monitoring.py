"""PodMonitors (their CRD, KubeRay's conventions, pods they really select) and the
Grafana dashboard's ConfigMap."""

from __future__ import annotations

import json

import kubernetes_validate
import pytest
import yaml

from cluster.k8s.manifests import PODMONITOR_FILE, RAYSERVICE_FILE, render
from cluster.k8s.monitoring import dashboard_configmap
from tests.unit.cluster.k8s.conftest import make_config
from tests.unit.cluster.k8s.schemas import DATA, PODMONITOR_CRD, crd_errors, load_crd

KUBERAY_PODMONITORS = DATA / "kuberay" / "prometheus-podMonitor.yaml"


@pytest.mark.parametrize("which", ["demo", "gpu"])
def test_podmonitors_pass_their_crd(which, request):
    for monitor in render(request.getfixturevalue(which), namespace="ml")[PODMONITOR_FILE]:
        assert crd_errors(monitor, load_crd(PODMONITOR_CRD)) == []
        assert monitor["metadata"]["labels"]["release"] == "prometheus"


def test_they_scrape_what_kuberays_podmonitors_scrape(demo):
    upstream = {m["spec"]["selector"]["matchLabels"]["ray.io/node-type"]: m["spec"]
                for m in yaml.safe_load_all(KUBERAY_PODMONITORS.read_text())}
    for monitor in render(demo)[PODMONITOR_FILE]:
        node_type = monitor["spec"]["selector"]["matchLabels"]["ray.io/node-type"]
        ours = monitor["spec"]["podMetricsEndpoints"]
        theirs = upstream[node_type]["podMetricsEndpoints"]
        assert [e["port"] for e in ours] == [e["port"] for e in theirs]
        for e in ours:
            (relabel,) = e["relabelings"]
            assert relabel["targetLabel"] == "ray_io_cluster"
            assert relabel["sourceLabels"] == ["__meta_kubernetes_pod_label_ray_io_cluster"]


def test_each_selects_its_pods_and_finds_its_ports_there(gpu):
    files = render(gpu)
    spec = files[RAYSERVICE_FILE][0]["spec"]["rayClusterConfig"]
    pods = {"head": [spec["headGroupSpec"]["template"]],
            "worker": [g["template"] for g in spec["workerGroupSpecs"]]}
    for monitor in files[PODMONITOR_FILE]:
        wanted = dict(monitor["spec"]["selector"]["matchLabels"])
        node_type = wanted.pop("ray.io/node-type")  # KubeRay labels each pod with it
        for template in pods[node_type]:
            assert wanted.items() <= template["metadata"]["labels"].items()
            named = {p["name"] for p in template["spec"]["containers"][0]["ports"]}
            assert {e["port"] for e in monitor["spec"]["podMetricsEndpoints"]} <= named


def test_no_release_label_when_asked_for_none():
    config = make_config(kubernetes={"prometheus_release": None})
    assert all("release" not in m["metadata"]["labels"] for m in render(config)[PODMONITOR_FILE])


def test_the_dashboard_configmap_is_a_valid_configmap_grafanas_sidecar_loads():
    dashboard = {"title": "Raybatch", "uid": "raybatch", "panels": [{"id": 1}]}
    cm = dashboard_configmap("raybatch", dashboard, {"app.kubernetes.io/name": "raybatch"},
                             namespace="ml")
    kubernetes_validate.validate(cm, "1.37.0", strict=True)
    assert cm["metadata"]["labels"]["grafana_dashboard"] == "1"
    (text,) = cm["data"].values()
    assert json.loads(text) == dashboard
