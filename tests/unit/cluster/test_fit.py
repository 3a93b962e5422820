"""GPU replicas are never multiplied by the ingress replicas, and a config whose minimum
cannot fit the cluster is refused with the arithmetic (`cluster.fit`)."""

from __future__ import annotations

from pathlib import Path

import pytest

from cluster.config import ConfigError, load_config
from cluster.fit import check_fit, minimum_demand, shortfall

GPU_YAML = Path(__file__).resolve().parents[3] / "deployments" / "configs" / "gpu.yaml"
T = {"inputs": [{"name": "X", "datatype": "FP32", "shape": [-1]}],
     "outputs": [{"name": "Y", "datatype": "FP32", "shape": [-1]}]}


def config(ingress: int, **model):
    return load_config({"ingress": {"num_replicas": ingress, "num_cpus": 1},
                        "models": [{"name": "m", "transformer": "a.b:C", **T, **model}]})


def test_a_gpu_model_defaults_to_one_shared_pool_and_a_cpu_model_to_the_ingress():
    gpu = config(2, replicas={"num_gpus": 0.5})
    assert gpu.models[0].batcher.placement == "actor"
    assert config(2, replicas={"num_cpus": 1}).models[0].batcher.placement == "ingress"


def test_placement_ingress_that_would_multiply_gpu_replicas_is_refused_with_the_fix():
    with pytest.raises(ConfigError) as e:
        config(2, replicas={"num_gpus": 1}, batcher={"placement": "ingress"})
    assert "2 x 1 = 2 GPU replicas for min_replicas=1" in str(e.value)
    assert "set batcher.placement to 'actor'" in str(e.value)
    ok = config(2, replicas={"num_gpus": 1, "min_replicas": 2, "max_replicas": 2},
                batcher={"placement": "ingress"})  # 2 / 2 each: nothing multiplied
    assert sum(n.count for n in minimum_demand(ok) if n.what == "m replica") == 2


def test_gpu_yaml_asks_for_one_gpu_and_fits_a_one_gpu_machine():
    c = load_config(GPU_YAML)
    gpus = sum(n.count * n.each.get("GPU", 0) for n in minimum_demand(c))
    assert gpus == 1
    check_fit(c, [{"CPU": 16, "GPU": 1}])


def test_a_minimum_that_does_not_fit_is_refused_with_the_arithmetic():
    c = load_config(GPU_YAML)
    with pytest.raises(ConfigError) as e:
        check_fit(c, [{"CPU": 16}])
    assert "GPU: 1 mlp replica x 0.5 + 1 minilm replica x 0.5 = 1, the cluster has 0" \
        in str(e.value)
    assert "lower replicas.min_replicas" in str(e.value)
    cpus = shortfall(minimum_demand(c), [{"CPU": 4, "GPU": 1}])
    assert cpus and cpus[0].startswith("CPU: 2 ingress replicas x 1 + ") and "= 8" in cpus[0]


def test_an_actor_larger_than_every_node_is_refused_though_the_sum_fits():
    c = config(1, replicas={"num_cpus": 4})
    assert shortfall(minimum_demand(c), [{"CPU": 3}, {"CPU": 3}]) == [
        "one m replica asks CPU 4; no node has that much (the largest has CPU 3)"]


def test_up_refuses_a_local_ray_that_cannot_fit_and_waits_on_a_cluster(monkeypatch, capsys):
    import types

    from raybatch.startup import fits_cluster

    fake = types.SimpleNamespace(nodes=lambda: [{"Alive": True, "Resources": {"CPU": 16}}])
    monkeypatch.setitem(__import__("sys").modules, "ray", fake)
    c = load_config(GPU_YAML)
    assert not fits_cluster(c, local=True)
    assert "GPU: 1 mlp replica x 0.5" in capsys.readouterr().err
    assert fits_cluster(c, local=False)  # a cluster may grow: deploy, and say what it waits for
    assert "waiting for the cluster to grow" in capsys.readouterr().out


def test_up_refuses_before_ray_starts_what_the_given_cpus_and_gpus_cannot_hold(capsys):
    from raybatch.startup import fits_as_asked

    c = load_config(GPU_YAML)
    assert not fits_as_asked(c, 8, 0)
    err = capsys.readouterr().err
    assert "GPU: 1 mlp replica x 0.5 + 1 minilm replica x 0.5 = 1, the cluster has 0" in err
    assert "CPU" not in err.split("\n")[1]  # 8 CPUs hold the CPU minimum: only the GPUs
    assert not fits_as_asked(c, 0, None)
    assert "CPU: " in capsys.readouterr().err
    # what Ray would find itself is not guessed: checked once it runs (`fits_cluster`)
    assert fits_as_asked(c, None, None)
    assert fits_as_asked(c, None, 1)
    assert capsys.readouterr().err == ""
