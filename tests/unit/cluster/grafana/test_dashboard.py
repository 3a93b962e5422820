"""The rendered dashboard against Grafana's own schemas (strict), and its structure.

The schemas are in tests/data/grafana (copied from the project's shared data).
Every panel is checked against the dashboard model, every timeseries panel's
options and field config against the `timeseries` plugin's schema, every query
against the Prometheus query schema. Whether each expression returns data is
checked against a real Prometheus in tests/integration/test_prometheus.py.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import jsonschema
import pytest

from cluster.config import load_config, load_default
from cluster.grafana.dashboard import dashboard_uid, expressions, render_dashboard
from cluster.grafana.panels import GridPos, Panel
from deployments.metrics import SERIES

SCHEMAS = Path(__file__).resolve().parents[3] / "data" / "grafana"
APP = Path(__file__).resolve().parents[3] / "configs" / "app.yaml"


def schema(name: str, definition: str | None = None) -> dict:
    s = json.loads((SCHEMAS / f"{name}.jsonschema.json").read_text())
    return s if definition is None else {**s, "$ref": f"#/definitions/{definition}"}


def validate(instance, s) -> list[str]:
    v = jsonschema.Draft7Validator(s, format_checker=jsonschema.Draft7Validator.FORMAT_CHECKER)
    return [f"{'/'.join(map(str, e.absolute_path))}: {e.message}" for e in v.iter_errors(instance)]


@pytest.fixture(scope="module", params=["demo", "tests"])
def dashboard(request) -> dict:
    config = load_default() if request.param == "demo" else load_config(APP)
    return render_dashboard(config)


def test_the_dashboard_is_valid_against_grafana_s_dashboard_schema(dashboard):
    assert validate(dashboard, schema("dashboard")) == []
    assert dashboard["schemaVersion"] >= 39


def test_every_timeseries_panel_and_every_query_is_valid_against_its_plugin_s_schema(dashboard):
    options, custom = schema("timeseries", "Options"), schema("timeseries", "GraphFieldConfig")
    query = schema("prometheus")
    panels = [p for p in dashboard["panels"] if p["type"] != "row"]
    assert {p["type"] for p in panels} == {"timeseries", "heatmap"}
    for p in panels:
        for t in p["targets"]:
            assert validate(t, query) == [], (p["title"], t)
        if p["type"] == "timeseries":
            assert validate(p["options"], options) == [], p["title"]
            assert validate(p["fieldConfig"]["defaults"]["custom"], custom) == [], p["title"]


def test_ids_are_unique_and_panels_tile_the_grid_without_overlap(dashboard):
    panels = dashboard["panels"]
    ids = [p["id"] for p in panels]
    assert len(ids) == len(set(ids))
    cells = set()
    for p in panels:
        g = p["gridPos"]
        assert g["x"] >= 0 and g["x"] + g["w"] <= 24
        mine = {(x, y) for x in range(g["x"], g["x"] + g["w"])
                for y in range(g["y"], g["y"] + g["h"])}
        assert not cells & mine, p["title"]
        cells |= mine
    with pytest.raises(ValueError, match="24-column grid"):
        GridPos(20, 0, 6, 8)


def test_one_row_per_model_after_the_overview_and_http_with_the_panels_of_its_kind():
    config = load_config(APP)
    d = render_dashboard(config)
    rows, current = {}, None
    for p in d["panels"]:
        if p["type"] == "row":
            current = rows.setdefault(p["title"], [])
        else:
            current.append(p)
    titles = list(rows)
    assert titles[:2] == ["All models", "HTTP ingress"]
    http = {p["title"]: p["targets"][0]["expr"] for p in rows["HTTP ingress"]}
    assert http["HTTP responses/s by route and status"] == (
        'sum by (route, status) (rate(ray_raybatch_http_requests_total'
        '{ray_io_cluster=~"$cluster"}[$__rate_interval]))')
    assert 'status=~"[45].."' in http["HTTP errors/s by status"]
    assert titles[2:] == [f"{m.name} ({m.batching.kind}, version {m.version})"
                          for m in config.models]
    by_model = {t.split(" ")[0]: [p["title"] for p in ps] for t, ps in rows.items()}
    for name in ("square", "accumulator", "tinylm"):
        assert {"Throughput", "Queue wait", "Queue depth", "Batch size distribution",
                "Batches by flush reason", "Replicas", "Errors by outcome"} <= set(
            by_model[name])
    assert "Sequences" in by_model["accumulator"] and "Sequences" not in by_model["square"]
    assert {"Generation", "Time to first token, inter-token latency"} <= set(
        by_model["tinylm"])
    heatmap = next(p for p in rows["square (dynamic, version 1)"] if p["type"] == "heatmap")
    assert heatmap["targets"][0]["format"] == "heatmap"
    assert "_bucket" in heatmap["targets"][0]["expr"]
    reasons = next(p for p in rows["square (dynamic, version 1)"]
                   if p["title"] == "Batches by flush reason")
    assert reasons["fieldConfig"]["defaults"]["custom"]["stacking"]["mode"] == "normal"


def test_every_selector_carries_the_filter_and_names_a_declared_series(dashboard):
    exported = set()
    for s in SERIES:
        suffixes = ("_bucket", "_sum", "_count") if s.kind == "histogram" else ("",)
        exported |= {s.exported + x for x in suffixes}
    used = set()
    for title, expr in expressions(dashboard):
        metrics = re.findall(r"(ray_raybatch_\w+)", expr)
        assert metrics, (title, expr)
        # one filter, everywhere: the cluster, and the model (the HTTP series has none)
        selectors = re.findall(r'ray_raybatch_\w+\{ray_io_cluster=~"\$cluster",model=', expr)
        selectors += re.findall(r'ray_raybatch_http_\w+\{ray_io_cluster=~"\$cluster"[,}]', expr)
        assert len(selectors) == len(metrics), (title, expr)
        used |= set(metrics)
    assert used <= exported, used - exported
    latency = [e for _, e in expressions(dashboard) if "histogram_quantile" in e]
    assert latency and all("_bucket{" in e and "sum by (le" in e for e in latency)


def test_variables_for_datasource_cluster_and_model(dashboard):
    names = {v["name"]: v for v in dashboard["templating"]["list"]}
    assert list(names) == ["datasource", "cluster", "model"]
    assert names["datasource"]["type"] == "datasource"
    assert names["cluster"]["allValue"] == ".*" and "ray_io_cluster" in names["cluster"]["query"]
    assert names["model"]["multi"] and "label_values(" in names["model"]["query"]
    for p in dashboard["panels"]:
        if p["type"] != "row":
            assert p["datasource"] == {"type": "prometheus", "uid": "${datasource}"}


def test_the_uid_is_stable_and_grafana_shaped():
    config = load_default()
    assert render_dashboard(config) == render_dashboard(config)
    assert render_dashboard(config)["uid"] == "raybatch"
    assert dashboard_uid("raybatch-test") == "raybatch-test"
    assert dashboard_uid("my app/prod") == "raybatch-my-app-prod"
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,40}", dashboard_uid("x" * 80))
    assert render_dashboard(config, title="T", uid="u1")["uid"] == "u1"


def test_a_panel_has_its_unit_and_a_description():
    p = Panel("t", "d", ()).to_json(1, GridPos(0, 0, 12, 8))
    assert p["fieldConfig"]["defaults"]["unit"] == "short" and p["description"] == "d"
