"""Grafana: the dashboard of a Raybatch app, built from its config, and publishing it.

    panels.py     GridPos, Target, Panel, Row: the typed pieces, each with its JSON
    promql.py     PromQL from small functions around one threaded Filter (no templates)
    dashboard.py  render_dashboard(config): the dashboard as a dict (a plain function)
    publish.py    publish(dashboard, url, ...): grafana-client, errors as one line each
"""

from cluster.grafana.dashboard import dashboard_json, render_dashboard

__all__ = ["dashboard_json", "render_dashboard"]
