"""The GPU check's own arithmetic and the CPU stand-in config it serves without a GPU."""

from __future__ import annotations

from collections import Counter
from pathlib import Path

import yaml

from benchmarks.serve.gpu_check import counter_delta, cpu_stand_in, histogram, main
from cluster.config import load_config

ROOT = Path(__file__).resolve().parents[3]


def test_histogram_buckets_batch_sizes_by_powers_of_two():
    assert histogram(Counter({1: 3, 2: 1, 3: 2, 64: 5, 100: 1, 256: 2})) == \
        "1:3 2-3:3 64-127:6 256-511:2"


def test_counter_delta_keeps_what_changed_in_the_window():
    assert counter_delta({"delay": 10, "full": 4}, {"delay": 7, "full": 4}) == {"delay": 3}
    assert counter_delta({"32": 2}, {}) == {"32": 2}


def test_the_cpu_stand_in_keeps_the_checked_models_on_one_batching_actor_each(tmp_path):
    path = cpu_stand_in(ROOT / "deployments/configs/gpu.yaml", ["mlp"], tmp_path)
    doc = yaml.safe_load(path.read_text())
    assert [m["name"] for m in doc["models"]] == ["mlp"]
    config = load_config(path)
    (mlp,) = config.models
    assert mlp.replicas.num_gpus == 0 and mlp.replicas.num_cpus == 1
    assert mlp.batcher.placement == "actor"  # as a GPU model gets by default


def test_without_a_gpu_it_says_skip_and_succeeds(monkeypatch, capsys):
    monkeypatch.setattr("benchmarks.serve.gpu_check.has_cuda", lambda: False)
    monkeypatch.setattr("sys.argv", ["gpu_check"])
    assert main() == 0
    assert capsys.readouterr().out.startswith("SKIP: no CUDA GPU")
