"""`raybatch render k8s`: files or a stream, options applied, bad configs a clear exit 2."""

from __future__ import annotations

import yaml

from raybatch.main import main
from tests.conftest import ROOT

GPU_PATH = ROOT / "deployments" / "configs" / "gpu.yaml"
GPU = str(GPU_PATH)


def test_writes_one_file_per_kind_into_the_folder(tmp_path, capsys):
    out = tmp_path / "manifests"
    assert main(["render", "k8s", "--config", GPU, "--image", "reg.io/rb:7",
                 "--namespace", "ml", "-o", str(out)]) == 0
    assert sorted(p.name for p in out.iterdir()) == [
        "grafana-dashboard.yaml", "podmonitors.yaml", "rayservice.yaml"]
    (service,) = yaml.safe_load_all((out / "rayservice.yaml").read_text())
    assert service["metadata"]["namespace"] == "ml"
    images = {g["groupName"]: g["template"]["spec"]["containers"][0]["image"]
              for g in service["spec"]["rayClusterConfig"]["workerGroupSpecs"]}
    assert images == {"cpu": "reg.io/rb:7", "gpu": "reg.io/rb:7-gpu"}
    assert f"kubectl apply -f {out}" in capsys.readouterr().out
    assert (out / "rayservice.yaml").read_text().startswith(
        f"# Rendered by `raybatch render k8s --config {GPU}`")


def test_prints_one_stream_without_a_folder(capsys, monkeypatch):
    monkeypatch.delenv("RAYBATCH_CONFIG", raising=False)
    assert main(["render", "k8s"]) == 0  # the bundled demo
    kinds = [d["kind"] for d in yaml.safe_load_all(capsys.readouterr().out)]
    assert kinds == ["RayService", "PodMonitor", "PodMonitor", "ConfigMap"]


def test_a_config_that_cannot_deploy_exits_2_saying_why(tmp_path, capsys):
    cfg = tmp_path / "big.yaml"
    data = yaml.safe_load(GPU_PATH.read_text())
    data["models"][2]["replicas"]["num_cpus"] = 32
    cfg.write_text(yaml.safe_dump(data))
    assert main(["render", "k8s", "--config", str(cfg), "-o", str(tmp_path / "out")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("raybatch render k8s: model 'square' replica asks 32 CPUs")
    assert not (tmp_path / "out").exists()
    data["app_name"] = "Shop_Prod"
    del data["models"][2]
    cfg.write_text(yaml.safe_dump(data))
    assert main(["render", "k8s", "--config", str(cfg)]) == 2
    assert "app_name='Shop_Prod' is not a valid Kubernetes name" in capsys.readouterr().err


def test_an_image_or_namespace_kubernetes_would_refuse_exits_2_before_any_file(tmp_path,
                                                                                capsys):
    """They were written into the manifests as given (`image: a b`, `namespace: Bad_NS`),
    for kubectl to refuse later; `--image ''` fell back to the default without a word."""
    out = tmp_path / "out"
    for flag, value, says in [
        ("--image", "a b", "--image='a b' is not an image reference"),
        ("--image", "", "--image='' is not an image reference"),
        ("--gpu-image", "Reg.io/Rb:7", "--gpu-image='Reg.io/Rb:7' is not an image reference"),
        ("--namespace", "Bad_NS", "namespace 'Bad_NS' is not a Kubernetes namespace"),
        ("--namespace", "", "namespace '' is not a Kubernetes namespace"),
    ]:
        assert main(["render", "k8s", "--config", GPU, flag, value, "-o", str(out)]) == 2
        assert says in capsys.readouterr().err
        assert not out.exists()
    cfg = tmp_path / "bad-image.yaml"
    data = yaml.safe_load(GPU_PATH.read_text())
    data["kubernetes"]["image"] = "registry.example.com:5000/Raybatch"
    cfg.write_text(yaml.safe_dump(data))
    assert main(["render", "k8s", "--config", str(cfg)]) == 2
    assert ("kubernetes.image: image='registry.example.com:5000/Raybatch' is not an image "
            "reference") in capsys.readouterr().err
    for ok in ("registry.example.com:5000/team/raybatch:0.1.0", "localhost/rb@sha256:" + "a" * 64,
               "0-numbered-ns"):
        flag = "--namespace" if ok == "0-numbered-ns" else "--image"
        assert main(["render", "k8s", "--config", GPU, flag, ok]) == 0, capsys.readouterr().err
        capsys.readouterr()
