"""Configs to render: the two checked in (demo, GPU) and small ones built per test."""

from __future__ import annotations

from typing import Any

import pytest

from cluster.config import DEMO_CONFIG, RaybatchConfig, load_config
from tests.conftest import ROOT

GPU_CONFIG = ROOT / "deployments" / "configs" / "gpu.yaml"


def model(name: str = "square", **replicas: Any) -> dict[str, Any]:
    """A model entry of a config, with `replicas` as given."""
    return {"name": name, "transformer": "deployments.models:Square",
            "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1]}],
            "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1]}],
            "replicas": replicas}


def make_config(*models: dict[str, Any], **top: Any) -> RaybatchConfig:
    return load_config({"app_name": "shop", "models": list(models) or [model()], **top})


@pytest.fixture(scope="session")
def demo() -> RaybatchConfig:
    return load_config(DEMO_CONFIG)


@pytest.fixture(scope="session")
def gpu() -> RaybatchConfig:
    return load_config(GPU_CONFIG)
