"""The RayService: accepted by KubeRay's CRDs, read right by Ray's KubeRay autoscaler,
carrying exactly what `raybatch build` deploys."""

from __future__ import annotations

import copy

import pytest
import yaml
from ray.autoscaler._private.kuberay.autoscaling_config import (
    _derive_autoscaling_config_from_ray_cr,
)
from ray.serve.schema import ServeDeploySchema

from cluster.config import load_config
from cluster.k8s import rayservice as rayservice_module
from cluster.k8s.manifests import RAYSERVICE_FILE, default_image, render
from cluster.k8s.rayservice import pod_serve_config, serve_process_env
from cluster.render import serve_config
from tests.unit.cluster.k8s.conftest import make_config, model
from tests.unit.cluster.k8s.schemas import (
    RAYCLUSTER_CRD,
    RAYSERVICE_CRD,
    crd_errors,
    label_errors,
    load_crd,
    unknown_keys,
)


def service_of(config, **kwargs) -> dict:
    (service,) = render(config, **kwargs)[RAYSERVICE_FILE]
    return service


def node_types(service: dict) -> dict:
    """What Ray's autoscaler (KubeRay's, in the head pod) makes of the cluster spec."""
    ray_cr = {"metadata": {"name": "c", "namespace": "default"},
              "spec": copy.deepcopy(service["spec"]["rayClusterConfig"])}
    return _derive_autoscaling_config_from_ray_cr(ray_cr)


@pytest.mark.parametrize("which", ["demo", "gpu"])
def test_the_rayservice_and_its_cluster_pass_kuberays_crds(which, request):
    service = service_of(request.getfixturevalue(which), namespace="serving")
    assert crd_errors(service, load_crd(RAYSERVICE_CRD)) == []
    cluster = {"apiVersion": "ray.io/v1", "kind": "RayCluster",
               "metadata": {"name": f"{service['metadata']['name']}-abcde"},
               "spec": service["spec"]["rayClusterConfig"]}
    assert crd_errors(cluster, load_crd(RAYCLUSTER_CRD)) == []  # what KubeRay creates
    spec = service["spec"]["rayClusterConfig"]
    for group in (spec["headGroupSpec"], *spec["workerGroupSpecs"]):
        assert "labels" not in group["rayStartParams"]  # KubeRay >= 1.5 refuses it there
        assert label_errors(group.get("labels", {})) == []


@pytest.mark.parametrize("which", ["demo", "gpu"])
def test_serve_config_is_what_raybatch_build_renders_listening_on_the_pod(which, request):
    config = request.getfixturevalue(which)
    serve = yaml.safe_load(service_of(config)["spec"]["serveConfigV2"])
    built = serve_config(config)
    built["http_options"]["host"] = "0.0.0.0"
    built["applications"][0]["args"]["config"]["ingress"]["host"] = "0.0.0.0"
    # no native server on pods: KubeRay's serve Service is the way in (pod_serve_config)
    built["applications"][0]["args"]["config"]["ingress"]["native_port"] = None
    assert serve == built
    assert unknown_keys(serve, ServeDeploySchema) == []  # Serve ignores unknown keys
    (app,) = ServeDeploySchema.model_validate(serve).applications
    inline = load_config(app.args["config"])
    assert inline.models == config.models and inline.kubernetes == config.kubernetes


def test_every_ray_container_gets_serves_settings_as_raybatch_up_gives_every_node(demo):
    from cluster.render import serve_environment

    wanted = serve_environment(demo)
    assert wanted["RAY_SERVE_THROUGHPUT_OPTIMIZED"] == "1"
    spec = service_of(demo)["spec"]["rayClusterConfig"]
    for group in (spec["headGroupSpec"], *spec["workerGroupSpecs"]):
        env = {e["name"]: e["value"] for e in group["template"]["spec"]["containers"][0]["env"]}
        assert {k: env.get(k) for k in wanted} == wanted, group.get("groupName", "head")


def test_serve_settings_of_the_build_reach_every_ray_process(monkeypatch, demo):
    def build(config):
        out = serve_config(config)
        out["applications"][0]["runtime_env"] = {"env_vars": {
            "RAY_SERVE_THROUGHPUT_OPTIMIZED": "1", "OMP_NUM_THREADS": "1"}}
        return out

    monkeypatch.setattr(rayservice_module, "serve_config", build)
    assert serve_process_env(pod_serve_config(demo)) == {"RAY_SERVE_THROUGHPUT_OPTIMIZED": "1"}
    spec = service_of(demo)["spec"]["rayClusterConfig"]
    for group in (spec["headGroupSpec"], *spec["workerGroupSpecs"]):
        env = {e["name"]: e["value"] for e in group["template"]["spec"]["containers"][0]["env"]}
        assert env["RAY_SERVE_THROUGHPUT_OPTIMIZED"] == "1" and "OMP_NUM_THREADS" not in env


def test_head_runs_no_replica_and_exposes_dashboard_metrics_and_serve(gpu):
    service = service_of(gpu)
    spec = service["spec"]
    head = spec["rayClusterConfig"]["headGroupSpec"]
    assert head["rayStartParams"]["num-cpus"] == "0"
    ports = {p["name"]: p["containerPort"]
             for p in head["template"]["spec"]["containers"][0]["ports"]}
    assert ports["dashboard"] == 8265 and ports["metrics"] == 8080
    assert ports["serve"] == yaml.safe_load(spec["serveConfigV2"])["http_options"]["port"]
    assert spec["upgradeStrategy"] == {"type": "NewCluster"}
    cluster = spec["rayClusterConfig"]
    assert cluster["enableInTreeAutoscaling"] is True
    assert cluster["autoscalerOptions"]["version"] == "v2"
    assert cluster["autoscalerOptions"]["idleTimeoutSeconds"] == 120  # the config's


def test_rays_autoscaler_sees_each_groups_cpus_gpus_numa_cores_labels_and_bounds(gpu):
    config = node_types(service_of(gpu))
    assert config["idle_timeout_minutes"] == 2.0
    types = config["available_node_types"]
    assert types["headgroup"]["resources"]["CPU"] == 0
    cpu, gpus = types["cpu"], types["gpu"]
    assert {k: v for k, v in cpu["resources"].items() if k != "memory"} == {
        "CPU": 8, "numa0": 4}  # 8 CPUs with SMT: 4 physical cores, as `raybatch join` counts
    assert cpu["labels"]["raybatch.io/cores"] == "4"
    assert (cpu["min_workers"], cpu["max_workers"]) == (1, 2)
    assert {k: v for k, v in gpus["resources"].items() if k != "memory"} == {"CPU": 8, "GPU": 1}
    # mlp 1..4 + minilm 1..2 replicas, half a GPU each: two to a pod
    assert (gpus["min_workers"], gpus["max_workers"]) == (1, 3)


def test_the_head_says_which_numa_cores_the_autoscaler_can_add_only_for_pinned_models(gpu, demo):
    head = service_of(gpu)["spec"]["rayClusterConfig"]["headGroupSpec"]
    assert head["labels"] == {"raybatch.io/autoscale-numa0": "4"}
    head = service_of(demo)["spec"]["rayClusterConfig"]["headGroupSpec"]
    assert "labels" not in head  # the demo's replicas are fractional: nothing pins


def test_names_images_and_namespace():
    config = make_config(model(num_cpus=1),
                         kubernetes={"image": "reg.example.com/rb:1", "name": "shop-prod"})
    service = service_of(config, namespace="ml")
    assert service["metadata"]["name"] == "shop-prod"
    assert service["metadata"]["namespace"] == "ml"
    spec = service["spec"]["rayClusterConfig"]
    assert spec["headGroupSpec"]["template"]["spec"]["containers"][0]["image"] == \
        "reg.example.com/rb:1"
    gpu = make_config(model(num_cpus=1, num_gpus=1))

    def images(**kwargs):
        groups = service_of(gpu, **kwargs)["spec"]["rayClusterConfig"]["workerGroupSpecs"]
        return {g["groupName"]: g["template"]["spec"]["containers"][0]["image"] for g in groups}

    assert images(image="a/rb:2") == {"cpu": "a/rb:2", "gpu": "a/rb:2-gpu"}
    assert images(image="a/rb:2", gpu_image="a/cuda:2") == {"cpu": "a/rb:2", "gpu": "a/cuda:2"}
    assert images() == {"cpu": default_image(), "gpu": default_image(gpu=True)}
