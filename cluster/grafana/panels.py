"""The typed pieces a Grafana dashboard is built from: `GridPos`, `Target`, `Panel`, `Row`.

Each piece knows its own JSON (`to_json`) and nothing else; `cluster.grafana.dashboard`
puts them together. The JSON is what Grafana's own schemas ask for (schemaVersion
39 and later): `timeseries` panels with `options.legend/tooltip` and
`fieldConfig.defaults.custom` of that plugin, `heatmap` panels over Prometheus
buckets, Prometheus targets with `expr`, `legendFormat` and a `refId`. Every
panel and target names its data source as the `${datasource}` variable, so one
dashboard serves any Prometheus a user picks.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

DATASOURCE = {"type": "prometheus", "uid": "${datasource}"}
WIDTH = 24  # Grafana's grid


@dataclass(frozen=True, slots=True)
class GridPos:
    x: int
    y: int
    w: int
    h: int

    def __post_init__(self) -> None:
        if not (self.x >= 0 and self.w > 0 and self.x + self.w <= WIDTH and self.h > 0):
            raise ValueError(f"{self} does not fit Grafana's {WIDTH}-column grid")

    def to_json(self) -> dict[str, int]:
        return {"h": self.h, "w": self.w, "x": self.x, "y": self.y}


@dataclass(frozen=True, slots=True)
class Target:
    """One PromQL query of a panel; `legend` is Grafana's legendFormat ("{{reason}}")."""

    expr: str
    legend: str
    heatmap: bool = False  # Prometheus buckets, one series per `le`

    def to_json(self, ref_id: str) -> dict[str, Any]:
        out: dict[str, Any] = {"datasource": DATASOURCE, "editorMode": "code",
                               "expr": self.expr, "legendFormat": self.legend,
                               "range": True, "refId": ref_id}
        if self.heatmap:
            out["format"] = "heatmap"
        return out


@dataclass(frozen=True, slots=True)
class Panel:
    """A `timeseries` panel (or, with `heatmap`, a bucket heatmap) of its targets."""

    title: str
    description: str
    targets: tuple[Target, ...]
    unit: str = "short"  # Grafana's unit id: s, reqps, short, ...
    stacked: bool = False
    heatmap: bool = False
    width: int = 12
    height: int = 8
    min: float | None = 0

    def to_json(self, panel_id: int, pos: GridPos) -> dict[str, Any]:
        refs = [chr(ord("A") + i) for i in range(len(self.targets))]
        out: dict[str, Any] = {
            "datasource": DATASOURCE, "description": self.description,
            "gridPos": pos.to_json(), "id": panel_id, "title": self.title,
            "targets": [t.to_json(r) for t, r in zip(self.targets, refs)],
            "type": "heatmap" if self.heatmap else "timeseries",
        }
        if self.heatmap:
            out["options"] = _heatmap_options(self.unit)
            out["fieldConfig"] = {"defaults": {}, "overrides": []}
            return out
        defaults: dict[str, Any] = {"unit": self.unit, "custom": self._custom(),
                                    "color": {"mode": "palette-classic"}}
        if self.min is not None:
            defaults["min"] = self.min
        out["fieldConfig"] = {"defaults": defaults, "overrides": []}
        out["options"] = {"legend": {"calcs": [], "displayMode": "list", "placement": "bottom",
                                     "showLegend": True},
                          "tooltip": {"mode": "multi", "sort": "desc"}}
        return out

    def _custom(self) -> dict[str, Any]:
        return {"drawStyle": "line", "lineWidth": 1, "fillOpacity": 30 if self.stacked else 10,
                "showPoints": "never", "spanNulls": False,
                "stacking": {"group": "A", "mode": "normal" if self.stacked else "none"}}


def _heatmap_options(unit: str) -> dict[str, Any]:
    return {"calculate": False, "cellGap": 1, "yAxis": {"axisPlacement": "left", "unit": unit},
            "color": {"mode": "scheme", "scheme": "Oranges", "steps": 64, "exponent": 0.5,
                      "scale": "exponential", "fill": "dark-orange", "reverse": False},
            "rowsFrame": {"layout": "auto"}, "legend": {"show": True},
            "tooltip": {"mode": "single", "yHistogram": False, "showColorScale": False},
            "filterValues": {"le": 1e-9}}


@dataclass(frozen=True, slots=True)
class Row:
    """A row header and the panels under it, laid out left to right, wrapping."""

    title: str
    panels: tuple[Panel, ...] = field(default_factory=tuple)
    collapsed: bool = False
