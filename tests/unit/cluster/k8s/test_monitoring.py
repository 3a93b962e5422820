"""PodMonitors (their CRD, KubeRay's conventions, pods they really select) and the
Grafana dashboard's ConfigMap."""

from __future__ import annotations

import json

import kubernetes_validate
import pytest
import yaml

from cluster.grafana.dashboard import render_dashboard
from cluster.k8s.manifests import DASHBOARD_FILE, PODMONITOR_FILE, RAYSERVICE_FILE, render
from cluster.k8s.monitoring import dashboard_configmap
from cluster.k8s.sizing import RenderError
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


@pytest.mark.parametrize("which", ["demo", "gpu"])
def test_render_writes_the_config_s_dashboard_in_a_configmap_the_sidecar_loads(which,
                                                                               request):
    config = request.getfixturevalue(which)
    files = render(config, namespace="ml")
    (cm,) = files[DASHBOARD_FILE]
    kubernetes_validate.validate(cm, "1.37.0", strict=True)
    meta = cm["metadata"]
    assert meta["namespace"] == "ml" and meta["name"] == f"{config.app_name}-dashboard"
    assert meta["labels"]["grafana_dashboard"] == "1"
    (service,) = files[RAYSERVICE_FILE]
    instance = "app.kubernetes.io/instance"
    assert meta["labels"][instance] == service["metadata"]["labels"][instance]
    (text,) = cm["data"].values()
    assert json.loads(text) == render_dashboard(config)  # what `raybatch dashboard render` makes
    assert len(text.encode()) < 256 * 1024  # fits kubectl's last-applied annotation too


def test_a_dashboard_bigger_than_a_configmap_holds_is_refused_with_the_fix():
    dashboard = {"title": "huge", "panels": [{"id": i, "title": "x" * 200} for i in range(6000)]}
    with pytest.raises(RenderError, match=r"more than a ConfigMap holds .* split the models"):
        dashboard_configmap("raybatch", dashboard, {})
