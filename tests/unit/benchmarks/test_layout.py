"""The benchmarks' layout: grouped by what they measure, no import cycle, and the Serve
comparison's setups are the few documented ones plus checked one-off specs."""

from __future__ import annotations

import pytest

from benchmarks.serve import settings
from benchmarks.serve.models import bench_models, raybatch_config
from tests.conftest import ROOT
from tests.unit.test_layers import _cycles, _imports

GROUPS = {"serve", "http", "engine", "generation", "placement", "common"}


def _graph() -> dict[str, set[str]]:
    files = {".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__"): p
             for p in (ROOT / "benchmarks").rglob("*.py")}
    known = set(files)
    return {m: _imports(p, known) - {m} for m, p in files.items() if not m.endswith("__init__")}


def test_every_benchmark_lives_in_a_group():
    loose = [p.name for p in (ROOT / "benchmarks").glob("*.py") if p.name != "__init__.py"]
    assert loose == [], "put each benchmark in the group of what it measures"
    groups = {p.parent.name for p in (ROOT / "benchmarks").glob("*/__init__.py")}
    assert groups >= GROUPS


def test_no_import_cycle_among_the_benchmarks():
    graph = {m: {d for d in deps if d != "benchmarks"} for m, deps in _graph().items()}
    assert "benchmarks.serve.settings" in graph["benchmarks.serve.measure"]  # the graph is read
    assert _cycles(graph) == []
    assert _cycles({**graph, "benchmarks.serve.settings": {"benchmarks.serve.measure"}})


def test_the_named_setups_are_the_documented_ones():
    assert set(settings.SETUPS) == {"default", "inproc", "gpu", "actor"}
    mlp = bench_models()["mlp"]
    default = raybatch_config(mlp, "a", "/a", settings.spec_of("default"), 8180)
    model = default["models"][0]
    assert model["batcher"]["placement"] == "actor" and not model["replicas"]["in_process"]
    assert model["batching"]["idle_dispatch"] and default["ingress"]["native_port"] == 8180
    inproc = raybatch_config(mlp, "i", "/i", settings.spec_of("inproc"), 8182)["models"][0]
    assert inproc["batcher"]["placement"] == "ingress" and inproc["replicas"]["in_process"]
    gpu = raybatch_config(mlp, "g", "/g", settings.spec_of("gpu"), 8181)["models"][0]
    assert gpu["batching"]["fill_while_busy"] and gpu["replicas"]["read_ahead"]
    assert not gpu["replicas"]["in_process"]
    actor = raybatch_config(mlp, "b", "/b", settings.spec_of("actor"))["models"][0]
    assert actor["batcher"]["placement"] == "actor"


def test_a_custom_setup_is_checked_option_by_option():
    assert settings.spec_of("ingress+idle+fill+lead2") == "ingress+idle+fill+lead2"
    with pytest.raises(ValueError, match="unknown option 'zap'"):
        settings.spec_of("ingress+zap")
    with pytest.raises(ValueError, match="starting with actor or ingress"):
        settings.spec_of("fast")


def test_apps_and_ports_are_named_after_the_setups():
    s = settings.Settings(warmup_s=0, duration_s=1, ceiling_s=0,
                          setups=("default", "ingress+idle"), peers=("serve.batch",))
    assert settings.apps(s) == {"serve.batch": ("serve-batch", "/batched"),
                                "rb:default": ("rb-default", "/rb-default"),
                                "rb:ingress+idle": ("rb-ingress-idle", "/rb-ingress-idle")}
    assert settings.native_port(s, "rb:default") == s.port + 80
    assert settings.native_port(s, "rb:ingress+idle") is None
