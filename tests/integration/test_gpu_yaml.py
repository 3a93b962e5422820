"""`deployments/configs/gpu.yaml` starts on a machine with one GPU: `raybatch up` with a
local Ray of one GPU (Ray takes `--num-gpus 1` on a machine without one) deploys it, with
its model classes swapped for `tests.models:GpuStandIn`, which is handed `cuda` and never
touches it; everything else (replicas, GPUs, placement, ingress) as shipped. Without the
GPU, the same config is refused before anything is deployed, saying what it needs.
"""

from __future__ import annotations

import pytest
import yaml

from tests.conftest import ROOT
from tests.integration.test_up_stop import READY, start, world  # noqa: F401  (fixture)

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.own_ray]

GPU_YAML = ROOT / "deployments" / "configs" / "gpu.yaml"
WIDTH = {"mlp": 256, "minilm": 384}


@pytest.fixture
def gpu_yaml(tmp_path):
    config = yaml.safe_load(GPU_YAML.read_text())
    for m in config["models"]:
        if m["name"] in WIDTH:
            assert m["replicas"]["num_gpus"] > 0, "the shipped config's GPU models"
            m["transformer"] = "tests.models:GpuStandIn"
            m["init_kwargs"] = {"width": WIDTH[m["name"]]}
    path = tmp_path / "gpu.yaml"
    path.write_text(yaml.safe_dump(config))
    return path


def test_gpu_yaml_becomes_ready_on_one_gpu_and_answers(world, gpu_yaml):  # noqa: F811
    up = start(world, gpu_yaml, "--num-cpus", "8", "--num-gpus", "1")
    up.wait_for(READY, timeout_s=240)
    out = up.infer("", "mlp", {"name": "INPUT0", "datatype": "FP32", "shape": [2, 256],
                               "data": [0.5] * 512})
    assert out["outputs"][0]["shape"] == [2, 256] and out["outputs"][0]["data"][0] == 256
    out = up.infer("", "minilm", {"name": "INPUT0", "datatype": "BYTES", "shape": [1],
                                  "data": ["hello"]})
    assert out["outputs"][0]["shape"] == [1, 384] and out["outputs"][0]["data"][0] == 5
    out = up.infer("", "square", {"name": "INPUT0", "datatype": "FP32", "shape": [1],
                                  "data": [3.0]})
    assert out["outputs"][0]["data"] == [9.0]
    up.ctrl_c()
    assert up.exit_code(timeout_s=30) == 0, up.text()[-3000:]


def test_gpu_yaml_without_a_gpu_is_refused_with_the_arithmetic(world, gpu_yaml):  # noqa: F811
    up = start(world, gpu_yaml, "--num-cpus", "8", "--num-gpus", "0")
    assert up.exit_code(timeout_s=120) == 1, up.text()[-3000:]
    text = up.text()
    assert "GPU: 1 mlp replica x 0.5 + 1 minilm replica x 0.5 = 1, the cluster has 0" in text
    assert "deploying" not in text, text
