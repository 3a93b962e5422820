"""The Grafana dashboard of a Raybatch app, rendered from its config: a plain function.

`render_dashboard(config)` returns the dashboard as a dict (JSON at the edge:
`dashboard_json`), so the CLI writes it, `publish` sends it, and the Kubernetes
renderer can put it in a ConfigMap. Layout: an overview row (every model chosen
in the `model` variable side by side), the HTTP ingress's responses by route and
status, then one row per model of the config
with the panels its kind of batching has: throughput, queue wait quantiles,
queue depth, the batch-size heatmap, batches by flush reason (stacked), batch
times, replicas, batches in flight per replica, errors by outcome; live, lost and
idle-expired sequences for a stateful model; tokens/s, active sequences, time to
first token and inter-token latency for a generative one. Variables:
`datasource`, `cluster` (Ray's `ray_io_cluster` label, set by KubeRay's
PodMonitor; "All" matches a cluster without it) and `model`.

The series are named here as Prometheus sees them (`ray_` + the names declared in
`deployments.metrics`, which `cluster` may not import; a test checks they match).
"""

from __future__ import annotations

import json
import re
from itertools import count
from typing import Any

from cluster.config import ModelConfig, RaybatchConfig
from cluster.grafana.panels import DATASOURCE, WIDTH, GridPos, Panel, Row, Target
from cluster.grafana.promql import (
    CLUSTER_LABEL,
    Filter,
    increase,
    quantile,
    rate,
    series,
    sum_by,
)

SCHEMA_VERSION = 39
R = "ray_raybatch_"
REQUESTS = R + "requests_total"
QUEUED_REQUESTS, QUEUED_ITEMS = R + "queued_requests", R + "queued_items"
QUEUE_WAIT = R + "queue_wait_seconds"
BATCH_SIZE = R + "batch_size_items"
BATCHES = R + "batches_total"
BATCH_LATENCY, BATCH_COMPUTE = R + "batch_latency_seconds", R + "batch_compute_seconds"
INFLIGHT = R + "inflight_batches"
DESIRED, RUNNING, PENDING = R + "replicas_desired", R + "replicas_running", R + "replicas_pending"
PENDING_DEMAND = R + "replicas_pending_demand"
DEATHS, RETRIED = R + "replica_deaths_total", R + "retried_batches_total"
LIVE, LOST = R + "sequences_live", R + "sequences_lost_total"
IDLE = R + "sequences_idle_expired_total"
ACTIVE, TOKENS = R + "generation_active_sequences", R + "generation_tokens_total"
TTFT, INTER_TOKEN = R + "generation_ttft_seconds", R + "generation_inter_token_seconds"
CANCELLED = R + "generation_cancelled_total"
HTTP = R + "http_requests_total"


def _t(expr: str, legend: str) -> Target:
    return Target(expr, legend)


def _quantiles(histogram: str, f: Filter, what: str, qs=(0.5, 0.9, 0.99)) -> tuple[Target, ...]:
    return tuple(_t(quantile(q, histogram, f), f"{what} p{round(q * 100)}") for q in qs)


# -- the panels of one model's row -----------------------------------------------------------
def throughput(f: Filter, kind: str) -> Panel:
    targets = [_t(sum_by((), rate(REQUESTS, f.where(outcome="ok"))), "requests/s (ok)")]
    if kind == "iterative":
        targets.append(_t(sum_by((), rate(TOKENS, f)), "tokens/s"))
    else:
        targets.append(_t(sum_by((), rate(BATCH_SIZE + "_sum", f)), "items/s (in batches)"))
    return Panel("Throughput", "Requests answered per second, and the items (tokens, for a "
                 "generative model) the batches carried.", tuple(targets), unit="reqps")


def queue_wait(f: Filter) -> Panel:
    return Panel("Queue wait", "From a request's arrival at its batching actor to the batch "
                 "(generation step) it starts in: quantiles over the rate window.",
                 _quantiles(QUEUE_WAIT, f, "wait"), unit="s")


def queue_depth(f: Filter) -> Panel:
    return Panel("Queue depth", "Requests and items waiting for a batch, per priority level.",
                 (_t(sum_by(("priority",), series(QUEUED_REQUESTS, f)),
                     "requests, priority {{priority}}"),
                  _t(sum_by(("priority",), series(QUEUED_ITEMS, f)),
                     "items, priority {{priority}}")))


def batch_sizes(f: Filter) -> Panel:
    return Panel("Batch size distribution", "Batches per size bucket (items per batch; "
                 "sequences per step for a generative model) in each interval.",
                 (Target(sum_by(("le",), increase(BATCH_SIZE + "_bucket", f)), "{{le}}",
                         heatmap=True),), heatmap=True)


def flush_reasons(f: Filter) -> Panel:
    return Panel("Batches by flush reason", "Why batches left the queue: full, preferred "
                 "size, delay, deadline, drain (step: a generation step).",
                 (_t(sum_by(("reason",), rate(BATCHES, f)), "{{reason}}"),), stacked=True)


def batch_times(f: Filter) -> Panel:
    return Panel("Batch time", "Compute per batch as the replica measured it, and the round "
                 "trip the batching actor saw (transport and replica queue included).",
                 (*_quantiles(BATCH_COMPUTE, f, "compute", (0.5, 0.99)),
                  _t(quantile(0.99, BATCH_LATENCY, f), "round trip p99")), unit="s")


def replicas(f: Filter) -> Panel:
    return Panel("Replicas", "Replicas the scaling rule wants, those serving, and those "
                 "pending (not placed or starting) with the CPUs they ask for.",
                 (_t(sum_by((), series(DESIRED, f)), "desired"),
                  _t(sum_by((), series(RUNNING, f)), "running"),
                  _t(sum_by((), series(PENDING, f)), "pending"),
                  _t(sum_by(("resource",), series(PENDING_DEMAND, f)),
                     "pending demand: {{resource}}")))


def inflight(f: Filter) -> Panel:
    return Panel("Batches in flight per replica", "Batches (steps) sent to each replica and "
                 "not answered yet.", (_t(sum_by(("replica",), series(INFLIGHT, f)),
                                          "{{replica}}"),))


def errors(f: Filter, kind: str) -> Panel:
    targets = [_t(sum_by(("outcome",), rate(REQUESTS, f.excluding(outcome="ok"))),
                  "{{outcome}}"),
               _t(sum_by((), rate(DEATHS, f)), "replica deaths")]
    if kind == "dynamic":
        targets.append(_t(sum_by((), rate(RETRIED, f)), "retried batches"))
    return Panel("Errors by outcome", "Requests that ended without a result, per second, by "
                 "outcome; replica deaths and retried batches.", tuple(targets),
                 unit="reqps", stacked=True)


def sequences(f: Filter) -> Panel:
    return Panel("Sequences", "Sequences holding state on a replica; those lost with their "
                 "replica and those ended idle, per second.",
                 (_t(sum_by((), series(LIVE, f)), "live"),
                  _t(sum_by((), rate(LOST, f)), "lost/s"),
                  _t(sum_by((), rate(IDLE, f)), "idle-expired/s")))


def generation(f: Filter) -> Panel:
    return Panel("Generation", "Tokens generated per second, generations advancing, and "
                 "generations cancelled per second.",
                 (_t(sum_by((), rate(TOKENS, f)), "tokens/s"),
                  _t(sum_by((), series(ACTIVE, f)), "active sequences"),
                  _t(sum_by((), rate(CANCELLED, f)), "cancelled/s")))


def token_latency(f: Filter) -> Panel:
    return Panel("Time to first token, inter-token latency", "From a generation's arrival "
                 "to its first text; between two tokens of a sequence.",
                 (*_quantiles(TTFT, f, "TTFT", (0.5, 0.99)),
                  *_quantiles(INTER_TOKEN, f, "inter-token", (0.5, 0.99))), unit="s")


def model_row(m: ModelConfig, base: Filter) -> Row:
    """The row of model `m`: the panels every model has, then those of its kind."""
    f = base.where(model=m.name)
    kind = m.batching.kind
    panels = [throughput(f, kind), queue_wait(f), queue_depth(f), batch_sizes(f),
              flush_reasons(f), batch_times(f), replicas(f), inflight(f), errors(f, kind)]
    if kind == "sequence":
        panels.append(sequences(f))
    if kind == "iterative":
        panels += [generation(f), token_latency(f)]
    return Row(f"{m.name} ({kind}, version {m.version})", tuple(panels))


def overview_row(base: Filter) -> Row:
    f = base.matching(model="$model")
    return Row("All models", (
        Panel("Requests/s by model", "Answered requests per second.",
              (_t(sum_by(("model",), rate(REQUESTS, f.where(outcome="ok"))), "{{model}}"),),
              unit="reqps", width=6),
        Panel("Errors/s by model", "Requests ended without a result, per second.",
              (_t(sum_by(("model", "outcome"), rate(REQUESTS, f.excluding(outcome="ok"))),
                  "{{model}}: {{outcome}}"),), unit="reqps", width=6),
        Panel("Queue wait p99 by model", "99th percentile of the queue wait.",
              (_t(quantile(0.99, QUEUE_WAIT, f, by=("model",)), "{{model}}"),), unit="s",
              width=6),
        Panel("Replicas running by model", "Replicas serving batches.",
              (_t(sum_by(("model",), series(RUNNING, f)), "{{model}}"),), width=6),
    ))


def http_row(base: Filter) -> Row:
    """The ingress's HTTP responses (both its fast path and Serve's): no model label,
    a route template (`POST /v2/models/{model}/infer`) and a status code."""
    return Row("HTTP ingress", (
        Panel("HTTP responses/s by route and status", "Responses the ingress replicas "
              "sent, per second, by route template and status code (499: the client went "
              "away first).", (_t(sum_by(("route", "status"), rate(HTTP, base)),
                                  "{{status}} {{route}}"),), unit="reqps"),
        Panel("HTTP errors/s by status", "Responses with a 4xx or 5xx status, per second: "
              "4xx is the caller's to fix (the body says how), 503 a full or draining "
              "replica, other 5xx ours.",
              (_t(sum_by(("status",), rate(HTTP, base.matching(status="[45].."))),
                  "{{status}}"),), unit="reqps", stacked=True),
    ))


# -- the dashboard --------------------------------------------------------------------------
def layout(rows: list[Row]) -> list[dict[str, Any]]:
    """Row headers and panels as Grafana JSON, placed left to right and top to bottom,
    with ids 1, 2, 3... (unique: asserted)."""
    ids, out, y = count(1), [], 0
    for row in rows:
        out.append({"collapsed": row.collapsed, "gridPos": GridPos(0, y, WIDTH, 1).to_json(),
                    "id": next(ids), "panels": [], "title": row.title, "type": "row"})
        y, x, line_h = y + 1, 0, 0
        for p in row.panels:
            if x + p.width > WIDTH:
                y, x, line_h = y + line_h, 0, 0
            out.append(p.to_json(next(ids), GridPos(x, y, p.width, p.height)))
            x, line_h = x + p.width, max(line_h, p.height)
        y += line_h
    panel_ids = [p["id"] for p in out]
    assert len(set(panel_ids)) == len(panel_ids), f"panel ids repeat: {panel_ids}"
    return out


def variables() -> list[dict[str, Any]]:
    every_model = f"label_values({REQUESTS}{Filter.base()}, model)"
    clusters = f"label_values({REQUESTS}, {CLUSTER_LABEL})"
    return [
        {"type": "datasource", "name": "datasource", "label": "Data source",
         "query": "prometheus", "hide": 0, "refresh": 1},
        {"type": "query", "name": "cluster", "label": "Cluster", "datasource": DATASOURCE,
         "query": clusters, "definition": clusters, "includeAll": True, "allValue": ".*",
         "multi": False, "refresh": 2, "sort": 1, "hide": 0,
         "description": "Ray cluster (the ray_io_cluster label KubeRay's PodMonitor sets); "
                        "All also matches metrics without it.",
         "current": {"text": "All", "value": "$__all"}},
        {"type": "query", "name": "model", "label": "Model", "datasource": DATASOURCE,
         "query": every_model, "definition": every_model, "includeAll": True,
         "allValue": ".*", "multi": True, "refresh": 2, "sort": 1, "hide": 0,
         "description": "Models shown in the overview row.",
         "current": {"text": ["All"], "value": ["$__all"]}},
    ]


def dashboard_uid(app_name: str) -> str:
    """Stable across renders of the same app (Grafana: at most 40 of [A-Za-z0-9_-])."""
    slug = re.sub(r"[^A-Za-z0-9_-]+", "-", app_name).strip("-") or "app"
    return (slug if slug.startswith("raybatch") else f"raybatch-{slug}")[:40]


def render_dashboard(config: RaybatchConfig, title: str | None = None,
                     uid: str | None = None) -> dict[str, Any]:
    """The dashboard of `config`'s app as a dict (Grafana's dashboard JSON model)."""
    base = Filter.base()
    rows = [overview_row(base), http_row(base), *(model_row(m, base) for m in config.models)]
    return {
        "annotations": {"list": [{
            "builtIn": 1, "datasource": {"type": "grafana", "uid": "-- Grafana --"},
            "enable": True, "hide": True, "iconColor": "rgba(0, 211, 255, 1)",
            "name": "Annotations & Alerts", "type": "dashboard"}]},
        "description": f"Raybatch app {config.app_name!r}: requests, queues, batches, "
                       "replicas and generation, per model (rendered by raybatch dashboard).",
        "editable": True, "fiscalYearStartMonth": 0, "graphTooltip": 1, "links": [],
        "liveNow": False, "panels": layout(rows), "refresh": "10s",
        "schemaVersion": SCHEMA_VERSION, "tags": ["raybatch", "ray"],
        "templating": {"list": variables()}, "time": {"from": "now-1h", "to": "now"},
        "timepicker": {}, "timezone": "browser",
        "title": title or f"Raybatch: {config.app_name}",
        "uid": uid or dashboard_uid(config.app_name),
    }


def dashboard_json(config: RaybatchConfig, **kw: Any) -> str:
    return json.dumps(render_dashboard(config, **kw), indent=2) + "\n"


def expressions(dashboard: dict[str, Any]) -> list[tuple[str, str]]:
    """(panel title, expr) of every query of a rendered dashboard, in order."""
    return [(p["title"], t["expr"]) for p in dashboard["panels"] for t in p.get("targets", [])]
