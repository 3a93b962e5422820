"""Metadata, model config, server metadata, statistics and error bodies.

No server and no Ray: Triton's own client code encodes and decodes."""

from __future__ import annotations

import importlib.metadata
import json
import subprocess
import sys
from pathlib import Path

import pytest
from tritonclient.http._utils import _get_error

from deployments.protocol import (
    BatchStats,
    DurationStat,
    ModelCounters,
    ModelSpec,
    TensorSpec,
    error_body,
    metadata_json,
    model_config_json,
    served_extensions,
    server_metadata_json,
    stats_json,
)
from tests.unit.deployments.protocol.oip_cases import (
    SPEC,
)

# --- metadata, config, server, stats, errors --------------------------------------------


def test_model_metadata_is_oip():
    assert metadata_json(SPEC) == {
        "name": "m",
        "versions": ["3"],
        "platform": "raybatch",
        "inputs": [
            {"name": "x", "datatype": "FP32", "shape": [-1, 3]},
            {"name": "ids", "datatype": "INT32", "shape": [-1]},
            {"name": "text", "datatype": "BYTES", "shape": [-1, 2]},
        ],
        "outputs": [
            {"name": "y", "datatype": "FP32", "shape": [-1, 3]},
            {"name": "label", "datatype": "BYTES", "shape": [-1]},
        ],
    }


def test_model_config_is_tritons_without_the_batch_dim():
    config = model_config_json(
        SPEC, extra={"dynamic_batching": {"max_queue_delay_microseconds": 100}}
    )
    assert config["max_batch_size"] == 8
    assert [(t["name"], t["data_type"], t["dims"]) for t in config["input"]] == [
        ("x", "TYPE_FP32", [3]),
        ("ids", "TYPE_INT32", []),
        ("text", "TYPE_STRING", [2]),
    ]
    assert [(t["data_type"], t["dims"]) for t in config["output"]] == [
        ("TYPE_FP32", [3]),
        ("TYPE_STRING", []),
    ]
    assert config["dynamic_batching"] == {"max_queue_delay_microseconds": 100}
    flat = ModelSpec(
        "f", inputs=[TensorSpec("a", "UINT8", [4, -1])], outputs=[TensorSpec("b", "BOOL", [1])]
    )
    assert model_config_json(flat)["input"][0]["dims"] == [4, -1]
    assert model_config_json(flat)["max_batch_size"] == 0


@pytest.mark.parametrize(
    "build,message",
    [
        (lambda: TensorSpec("a", "BF16", [1]), "BF16"),
        (lambda: TensorSpec("a", "FP32", [-2]), "dims must be integers >= 0, or -1"),
        (
            lambda: ModelSpec(
                "b",
                inputs=[TensorSpec("a", "FP32", [3])],
                outputs=[TensorSpec("o", "FP32", [-1])],
                max_batch_size=4,
            ),
            "input 'a' needs -1 as its leading (batch) dim",
        ),
        (
            lambda: ModelSpec(
                "d",
                inputs=[TensorSpec("a", "FP32", [1])] * 2,
                outputs=[TensorSpec("o", "FP32", [1])],
            ),
            "duplicate input names",
        ),
        (
            lambda: ModelSpec("e", inputs=[TensorSpec("a", "FP32", [1])]),
            "at least one input and one output",
        ),
    ],
)
def test_bad_specs_fail_when_built(build, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        build()


def test_server_metadata_names_the_extensions():
    body = server_metadata_json()
    assert body["name"] == "raybatch"
    assert body["version"] == importlib.metadata.version("raybatch")
    assert body["extensions"] == ["binary_tensor_data", "model_repository", "statistics"]
    assert server_metadata_json("triton", "1", ["x"]) == {
        "name": "triton", "version": "1", "extensions": ["x"]}


@pytest.mark.parametrize(("kinds", "more"), [
    (["dynamic"], []),
    (["dynamic", "sequence"], ["sequence"]),
    (["iterative", "sequence", "sequence"], ["sequence", "generate"]),
])
def test_the_extensions_list_what_the_models_need_served(kinds, more):
    assert list(served_extensions(kinds)) == [
        "binary_tensor_data", "model_repository", "statistics", *more]


def test_stats_use_tritons_field_names():
    counters = ModelCounters(
        last_inference_ms=1_700_000_000_000,
        inference_count=10,
        execution_count=3,
        success=DurationStat(4, 4000),
        fail=DurationStat(1, 10),
        queue=DurationStat(4, 400),
        compute_infer=DurationStat(3, 3000),
        batch_stats=(
            BatchStats(8, compute_infer=DurationStat(1, 2000)),
            BatchStats(1, compute_infer=DurationStat(2, 1000)),
        ),
    )
    body = json.loads(json.dumps(stats_json("m", "3", counters)))
    (stat,) = body["model_stats"]
    assert (stat["name"], stat["version"], stat["last_inference"]) == ("m", "3", 1_700_000_000_000)
    assert (stat["inference_count"], stat["execution_count"]) == (10, 3)
    assert set(stat["inference_stats"]) == {
        "success",
        "fail",
        "queue",
        "compute_input",
        "compute_infer",
        "compute_output",
        "cache_hit",
        "cache_miss",
    }
    assert stat["inference_stats"]["success"] == {"count": 4, "ns": 4000}
    assert stat["inference_stats"]["compute_input"] == {"count": 0, "ns": 0}
    assert [b["batch_size"] for b in stat["batch_stats"]] == [1, 8]
    assert stat["batch_stats"][1] == {
        "batch_size": 8,
        "compute_input": {"count": 0, "ns": 0},
        "compute_infer": {"count": 1, "ns": 2000},
        "compute_output": {"count": 0, "ns": 0},
    }


class _ErrorResponse:
    """Just enough of a geventhttpclient response for tritonclient's error reader."""

    def __init__(self, status_code: int, body: bytes):
        self.status_code, self._body = status_code, body

    def read(self) -> bytes:
        return self._body


def test_error_body_is_what_tritonclient_reads():
    body = error_body('input "x" is wrong')
    assert json.loads(body) == {"error": 'input "x" is wrong'}
    error = _get_error(_ErrorResponse(400, body))
    assert error.message() == 'input "x" is wrong' and error.status() == "400"


def test_protocol_imports_neither_ray_nor_a_web_framework():
    script = (
        "import sys, deployments.protocol, deployments.protocol.generate\n"
        "heavy = ('ray', 'fastapi', 'starlette', 'tritonclient', 'uvicorn', 'httptools',\n"
        "         'deployments.http')\n"
        "print(sorted(m for m in heavy if m in sys.modules))"
    )
    root = Path(__file__).resolve().parents[4]
    proc = subprocess.run(
        [sys.executable, "-c", script], cwd=root, capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
