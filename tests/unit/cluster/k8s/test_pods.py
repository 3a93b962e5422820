"""Pods: restricted security on every container, Guaranteed workers, and a worker's numa<N>
cores and labels being what `raybatch join` would give a machine of its size."""

from __future__ import annotations

import kubernetes_validate
import pytest
from ray.autoscaler._private.kuberay.autoscaling_config import _get_custom_resources

from cluster.k8s.manifests import RAYSERVICE_FILE, render
from cluster.k8s.pods import numa_resources, pod_topology, ray_labels, start_params
from cluster.k8s.settings import CpuWorkers, GpuWorkers
from cluster.raynode import node_labels, node_resources
from cluster.topology import discover

K8S_VERSION = "1.37.0"


def pods_of(config) -> list[tuple[str, dict]]:
    """(group, pod template) of the head and every worker group."""
    spec = render(config)[RAYSERVICE_FILE][0]["spec"]["rayClusterConfig"]
    return [("head", spec["headGroupSpec"]["template"]),
            *[(g["groupName"], g["template"]) for g in spec["workerGroupSpecs"]]]


def restricted_violations(pod_security: dict, container_security: dict) -> list[str]:
    """The Pod Security Standard "restricted" rules a pod or container breaks."""
    merged = {**pod_security, **container_security}
    out = []
    if merged.get("runAsNonRoot") is not True or merged.get("runAsUser", 1) == 0:
        out.append("runs as root")
    if container_security.get("allowPrivilegeEscalation") is not False:
        out.append("may escalate privileges")
    if container_security.get("privileged"):
        out.append("privileged")
    if container_security.get("capabilities", {}).get("drop") != ["ALL"]:
        out.append("keeps capabilities")
    if merged.get("seccompProfile", {}).get("type") not in ("RuntimeDefault", "Localhost"):
        out.append("no seccomp profile")
    return out


@pytest.mark.parametrize("which", ["demo", "gpu"])
def test_every_container_is_restricted_the_autoscaler_sidecar_too(which, request):
    config = request.getfixturevalue(which)
    for group, template in pods_of(config):
        spec = template["spec"]
        for c in spec["containers"]:
            assert restricted_violations(spec["securityContext"], c["securityContext"]) == [], \
                (group, c["name"])
        assert spec["securityContext"]["runAsUser"] == 1000  # the Dockerfiles' user
    sidecar = render(config)[RAYSERVICE_FILE][0]["spec"]["rayClusterConfig"][
        "autoscalerOptions"]["securityContext"]
    head_pod = pods_of(config)[0][1]["spec"]["securityContext"]  # KubeRay puts it in the head
    assert restricted_violations(head_pod, sidecar) == []
    assert restricted_violations({}, {"capabilities": {"drop": ["NET_RAW"]}})  # can fail


@pytest.mark.parametrize("which", ["demo", "gpu"])
def test_workers_are_guaranteed_whole_cpus_and_templates_are_valid_core_pods(which, request):
    for group, template in pods_of(request.getfixturevalue(which)):
        (main,) = template["spec"]["containers"]
        assert main["resources"]["requests"] == main["resources"]["limits"], group
        assert float(main["resources"]["limits"]["cpu"]).is_integer()
        kubernetes_validate.validate({"apiVersion": "v1", "kind": "PodTemplate",
                                      "metadata": {"name": group}, "template": template},
                                     K8S_VERSION, strict=True)


def test_gpu_pods_have_their_gpus_a_toleration_and_no_numa_resources(gpu):
    (template,) = [t for group, t in pods_of(gpu) if group == "gpu"]
    limits = template["spec"]["containers"][0]["resources"]["limits"]
    assert limits["nvidia.com/gpu"] == "1"
    assert {"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"} in \
        template["spec"]["tolerations"]
    assert numa_resources(GpuWorkers()) == {}  # pinned CPU replicas stay off GPU pods


@pytest.mark.parametrize(("workers", "sysfs"), [
    (CpuWorkers(cpus=4), {0: [[0], [1], [2], [3]]}),
    (CpuWorkers(cpus=8, threads_per_core=2, numa_nodes=2),
     {0: [[0, 1], [2, 3]], 1: [[4, 5], [6, 7]]}),
])
def test_a_pod_advertises_what_raybatch_join_would_on_a_machine_of_its_size(
        workers, sysfs, fake_sysfs):
    fake_sysfs.cpus([core for node in sysfs.values() for core in node])
    fake_sysfs.numa({n: [c for core in cores for c in core] for n, cores in sysfs.items()})
    machine = discover(fake_sysfs.root)
    assert numa_resources(workers) == node_resources(machine)
    assert ray_labels(workers) == node_labels(machine)
    assert node_resources(pod_topology(workers)) == node_resources(machine)


def test_rayStartParams_resources_read_back_by_rays_kuberay_autoscaler():
    params = start_params(8, num_gpus=1, resources={"numa0": 4, "numa1": 4})
    assert params["num-cpus"] == "8" and params["num-gpus"] == "1"
    assert params["resources"] == '"{\\"numa0\\": 4, \\"numa1\\": 4}"'  # KubeRay's form
    assert _get_custom_resources({}, params, "cpu") == {"numa0": 4, "numa1": 4}
    assert "resources" not in start_params(0)
