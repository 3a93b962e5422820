"""A GPU replica of `mlp`: runs on cuda, reports its GPU, and is pinned to cores local to it.

Skipped cleanly without a CUDA GPU (torch sees none, or the session's Ray has no GPU
resource). Deployed as an app of its own beside the shared one.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.conftest import wait_until

pytestmark = [pytest.mark.integration, pytest.mark.gpu]

APP = "raybatch-gpu"


def cuda_gpus() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.fixture(scope="module")
def gpu_app(request):
    if not cuda_gpus():  # before the shared app is deployed: a skip should cost nothing
        pytest.skip("needs a CUDA GPU: torch.cuda sees none")
    request.getfixturevalue("app")  # Serve started, the session's Ray joined
    import ray
    from ray import serve

    from cluster.config import load_config
    from deployments.app import build_app

    if ray.cluster_resources().get("GPU", 0) < 1:
        pytest.skip("needs a GPU resource in the session's Ray")
    config = load_config({
        "app_name": APP,
        "ingress": {"num_cpus": 0, "route_prefix": "/gpu"},
        "models": [{
            "name": "mlp", "transformer": "deployments.models:MLP",
            "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1, 256]}],
            "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, 256]}],
            "batcher": {"num_cpus": 0},
            "replicas": {"min_replicas": 1, "max_replicas": 1, "num_cpus": 1, "num_gpus": 1},
        }],
    })
    handle = serve.run(build_app(config), name=APP, route_prefix="/gpu")
    yield handle
    serve.delete(APP)


def test_gpu_replica_runs_on_cuda_pinned_to_its_gpus_local_cores(gpu_app):
    from cluster.topology import discover
    from deployments.models import MLP

    x = np.random.default_rng(0).standard_normal((8, 256)).astype(np.float32)
    out = gpu_app.infer.remote("mlp", {"INPUT0": x}).result(timeout_s=120)["OUTPUT0"]
    cpu = MLP(threads=1)
    cpu.setup("cpu")
    np.testing.assert_allclose(out, cpu.postprocess(None, cpu.transform(cpu.preprocess(x))),
                               rtol=1e-3, atol=1e-3)  # TF32 on the GPU

    info = wait_until(lambda: gpu_app.status.remote().result(timeout_s=30)["mlp"]["replica_info"],
                      timeout_s=60, what="the GPU replica's info")[0]
    assert info["device"] == "cuda" and len(info["gpus"]) == 1, info
    gpu = next(g for g in discover().gpus if g.index == int(info["gpus"][0]))
    assert info["pinned"] and len(info["cpus"]) >= 1, info
    if gpu.local_cpus:  # the firmware says which CPUs are near it
        assert set(info["cpus"]) <= set(gpu.local_cpus), (info, gpu)
        assert info["numa_node"] == gpu.numa_node
