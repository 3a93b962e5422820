"""Worker groups: where each model goes, min and max pods, and configs that cannot deploy."""

from __future__ import annotations

import random
from collections import Counter

import pytest

from cluster.k8s.settings import CpuWorkers, GpuWorkers, KubernetesConfig
from cluster.k8s.sizing import Ask, RenderError, fits, plan_groups, pods_needed, replica_ask
from tests.unit.cluster.k8s.conftest import make_config, model


def bounds(config) -> dict[str, tuple[int, int]]:
    return {p.workers.name: (p.min_pods, p.max_pods)
            for p in plan_groups(config, config.kubernetes)}


def test_min_and_max_pods_hold_every_model_at_its_min_and_max_replicas():
    config = make_config(model(min_replicas=2, max_replicas=9, num_cpus=1),
                         ingress={"num_cpus": 0.5})
    # 4 CPUs a pod: min 2 replicas + the ingress in one pod; max 9 + 0.5 CPUs in three
    assert bounds(config) == {"cpu": (1, 3)}


def test_the_pool_starts_a_replica_even_at_min_replicas_0():
    config = make_config(model(min_replicas=0, max_replicas=1, num_cpus=1),
                         ingress={"num_cpus": 0})
    assert bounds(config) == {"cpu": (1, 1)}


def test_a_pinned_replicas_cores_come_from_one_numa_node_of_the_pod():
    two_nodes = {"cpu_workers": [{"cpus": 8, "numa_nodes": 2}]}  # 4 cores on each node
    config = make_config(model(min_replicas=1, max_replicas=4, num_cpus=3),
                         ingress={"num_cpus": 0}, kubernetes=two_nodes)
    # 8 CPUs hold two replicas of 3 cores: one per NUMA node, not a third across both
    assert bounds(config) == {"cpu": (1, 2)}
    unpinned = make_config(model(min_replicas=1, max_replicas=4, num_cpus=3, pin="off"),
                           ingress={"num_cpus": 0}, kubernetes=two_nodes)
    assert bounds(unpinned) == {"cpu": (1, 2)}  # 8 // 3 = 2 by CPUs alone too
    with pytest.raises(RenderError, match=r"asks 5 CPUs, 5 cores of one NUMA node \(replicas"
                                          r"\.num_cpus\), more than any worker pod has \(cpu: "
                                          r"8 CPUs, 4 cores per NUMA node\)"):
        plan_groups(c := make_config(model(num_cpus=5), kubernetes=two_nodes), c.kubernetes)


def test_smt_pods_count_physical_cores():
    smt = CpuWorkers(cpus=8, threads_per_core=2)
    assert smt.cores_per_numa_node == 4
    assert pods_needed([Ask(cpus=1, cores=1)] * 5, smt) == 2  # 4 cores a pod, CPUs to spare
    assert pods_needed([Ask(cpus=0.25)] * 32, smt) == 1
    with pytest.raises(ValueError, match=r"cpus=6 is not whole cores on 4 NUMA node\(s\) of 2 "
                                         r"thread\(s\) per core: make it a multiple of 8"):
        CpuWorkers(cpus=6, threads_per_core=2, numa_nodes=4)


def test_each_model_goes_to_the_first_group_it_fits_and_gpu_models_to_the_gpu_group():
    k8s = {"cpu_workers": [{"name": "small", "cpus": 2}, {"name": "big", "cpus": 16}]}
    config = make_config(model("a", num_cpus=1, max_replicas=3),
                         model("b", num_cpus=8, max_replicas=2),
                         model("c", num_cpus=2, num_gpus=1, max_replicas=3),
                         ingress={"num_cpus": 1, "num_replicas": 2}, kubernetes=k8s)
    plans = {p.workers.name: p for p in plan_groups(config, config.kubernetes)}
    assert {n: [d.what for d in p.demands] for n, p in plans.items()} == {
        "small": ["the ingress", "model 'a' replica"], "big": ["model 'b' replica"],
        "gpu": ["model 'c' replica"]}
    assert bounds(config) == {"small": (2, 3), "big": (1, 1), "gpu": (1, 3)}
    assert plans["gpu"].gpu and not plans["big"].gpu


def test_what_a_replica_asks_for_follows_the_pool():
    assert replica_ask(make_config(model(num_cpus=2.5)).models[0]) == Ask(2.5, 2, 0)
    assert replica_ask(make_config(model(num_cpus=0.5)).models[0]) == Ask(0.5, 0, 0)
    assert replica_ask(make_config(model(num_cpus=2, num_gpus=1)).models[0]) == Ask(2, 0, 1)
    named = make_config(model(num_cpus=1, resources={"numa1": 2})).models[0]
    assert replica_ask(named) == Ask(1, 2, 0)


@pytest.mark.parametrize(("models", "kubernetes", "message"), [
    ([model(num_cpus=16)], {},
     r"model 'square' replica asks 16 CPUs, 16 cores of one NUMA node \(replicas\.num_cpus\), "
     r"more than any worker pod has \(cpu: 4 CPUs, 4 cores per NUMA node\): lower "
     r"replicas\.num_cpus, or make the pods bigger under kubernetes\."),
    ([model(num_cpus=1, num_gpus=1)], {"gpu_workers": None},
     r"model 'square' asks replicas\.num_gpus=1 but kubernetes\.gpu_workers is null: describe "
     r"the GPU pods there, or set num_gpus to 0"),
    ([model(num_cpus=1, num_gpus=2)], {},
     r"asks 1 CPUs, 2 GPUs \(replicas\), more than any worker pod has \(gpu: 8 CPUs, 1 GPUs"),
    ([model(num_cpus=1, resources={"fpga": 1})], {},
     r"replicas\.resources names \['fpga'\], which no rendered worker group advertises"),
    ([{**model(), "batcher": {"placement": "actor", "num_cpus": 6}}], {},
     r"model 'square' batching actor asks 6 CPUs \(batcher\.num_cpus\)"),
    ([model(num_cpus=1, num_gpus=1, resources={"numa0": 1})], {},
     r"model 'square' asks for GPUs and numa<N> cores .* GPU pods advertise no numa<N>"),
])
def test_a_config_that_cannot_deploy_is_a_clear_error(models, kubernetes, message):
    config = make_config(*models, kubernetes=kubernetes)
    with pytest.raises(RenderError, match=message):
        plan_groups(config, config.kubernetes)


def test_the_ingress_must_fit_the_first_cpu_group():
    config = make_config(model(num_cpus=1), ingress={"num_cpus": 3},
                         kubernetes={"cpu_workers": [{"cpus": 2}, {"name": "big", "cpus": 8}]})
    with pytest.raises(RenderError, match=r"the ingress asks 3 CPUs \(ingress\.num_cpus\), more "
                                          r"than any worker pod has \(cpu: 2 CPUs"):
        plan_groups(config, config.kubernetes)


def test_settings_name_the_value_and_the_fix():
    with pytest.raises(ValueError, match=r"name='My_Group' is not a valid Kubernetes name.*"
                                         r"\(e\.g\. 'my-group'\)"):
        CpuWorkers(name="My_Group")
    with pytest.raises(ValueError, match=r"memory='8GB' is not a Kubernetes quantity"):
        GpuWorkers(memory="8GB")
    with pytest.raises(ValueError, match=r"worker group names \['cpu', 'cpu'\] repeat"):
        KubernetesConfig(cpu_workers=[{}], gpu_workers={"name": "cpu"})


def test_in_process_replicas_are_asked_for_by_their_engines_process():
    config = make_config(model("a", in_process=True, num_cpus=1, max_replicas=2),
                         {**model("b", in_process=True, num_cpus=0.5, max_replicas=2),
                          "batcher": {"placement": "actor", "num_cpus": 0.25}},
                         ingress={"num_cpus": 0.5})
    plans = plan_groups(config, config.kubernetes)
    asks = {d.what: (d.ask.cpus, d.count_min, d.count_max) for p in plans for d in p.demands}
    assert asks == {"the ingress": (0.5 + 2, 1, 1),
                    "model 'b' batching actor": (0.25 + 1.0, 1, 1)}


@pytest.mark.parametrize("top, message", [
    ({"models": [{**model(num_cpus=1), "batcher": {"placement": "actor",
                                                   "resources": {"head": 0.001}}}]},
     r"model 'square': batcher\.resources names \['head'\], which no rendered worker group "
     r"advertises"),
    ({"ingress": {"resources": {"front": 0.001}}},
     r"ingress\.resources names \['front'\], which no rendered worker group advertises"),
])
def test_batching_actors_and_the_ingress_ask_no_resource_no_pod_has(top, message):
    rest = {k: v for k, v in top.items() if k != "models"}
    config = make_config(*top.get("models", [model(num_cpus=1)]), **rest)
    with pytest.raises(RenderError, match=message):
        plan_groups(config, config.kubernetes)


def _one_by_one(asks: list[Ask], workers: CpuWorkers | GpuWorkers) -> int:
    """First-fit decreasing placing each ask in turn: what `pods_needed` must agree with."""
    pods: list[list[float]] = []
    for ask in sorted(asks, key=lambda a: (a.gpus, a.cores, a.cpus), reverse=True):
        for pod in [*pods, None]:
            if pod is None:
                pod = [float(workers.cpus), float(getattr(workers, "gpus", 0)),
                       *[float(workers.cores_per_numa_node)] * workers.numa_nodes]
                pods.append(pod)
            node = next((i for i in range(2, len(pod)) if pod[i] >= ask.cores), -1)
            if ask.cpus <= pod[0] + 1e-9 and ask.gpus <= pod[1] + 1e-9 and node >= 0:
                pod[0] -= ask.cpus
                pod[1] -= ask.gpus
                pod[node] -= ask.cores
                break
    return len(pods)


def test_packing_runs_of_asks_gives_what_placing_each_in_turn_gives():
    """Pods are packed a run of identical asks at a time: the pod count is the one placing
    each ask in turn gives, over random mixes (a fixed seed) of CPUs, cores and GPUs."""
    rng = random.Random(7)
    for _ in range(400):
        numa = rng.choice([1, 1, 2, 4])
        threads = rng.choice([1, 2])
        cpus = numa * threads * rng.randint(1, 8)
        workers = rng.choice([CpuWorkers(cpus=cpus, numa_nodes=numa, threads_per_core=threads),
                              GpuWorkers(cpus=cpus, numa_nodes=numa, threads_per_core=threads,
                                         gpus=rng.randint(1, 8))])
        gpus = getattr(workers, "gpus", 0)
        kinds = []
        for _ in range(rng.randint(1, 4)):
            ask = Ask(cpus=rng.choice([0, 0.1, 0.25, 0.5, 1, 1.5, 2, 3]) * rng.randint(1, 2),
                      cores=rng.randint(0, workers.cores_per_numa_node) * rng.randint(0, 1),
                      gpus=rng.choice([0, 0, 0.25, 0.5, 1, 2]) if gpus else 0)
            if fits(ask, workers):
                kinds.append((ask, rng.randint(0, 40)))
        asks = [ask for ask, n in kinds for _ in range(n)]
        rng.shuffle(asks)
        want = _one_by_one(asks, workers)
        assert pods_needed(asks, workers) == want, (workers, kinds)
        assert pods_needed(Counter(asks), workers) == want, (workers, kinds)


def test_a_max_replicas_in_the_billions_renders_at_once_and_past_int32_pods_is_refused():
    """The packing's work does not grow with the counts: a billion replicas is one run of
    pods; more pods than KubeRay's int32 maxReplicas is a RenderError naming the model."""
    config = make_config(model(min_replicas=1, max_replicas=10**9, num_cpus=1),
                         ingress={"num_cpus": 0})
    assert bounds(config) == {"cpu": (1, 10**9 // 4)}  # 4 CPUs a pod
    config = make_config(model(max_replicas=10**12, num_cpus=1), ingress={"num_cpus": 0})
    with pytest.raises(RenderError, match=r"worker group 'cpu' would need 250,000,000,000 pods"
                                          r" to hold every replica at its most \(model 'square' "
                                          r"replica: 1,000,000,000,000\), more than a RayCluster"
                                          r" worker group's maxReplicas can say"):
        plan_groups(config, config.kubernetes)
    with pytest.raises(ValueError, match=r"numa_nodes\s.*less than or equal to 1024"):
        CpuWorkers(cpus=2048, numa_nodes=2048)
    # a pod's topology is built core by core (its labels): its size is bounded too
    with pytest.raises(ValueError, match=r"cpus\s.*less than or equal to 8192"):
        CpuWorkers(cpus=2**63)
    with pytest.raises(ValueError, match=r"gpus\s.*less than or equal to 256"):
        GpuWorkers(gpus=10**9)
