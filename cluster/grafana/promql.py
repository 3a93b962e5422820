"""PromQL built from small functions, one `Filter` threaded through every expression.

No string templates: an expression is composed (`rate`, `sum_by`, `quantile`) around
a series selector `metric{filter}`, and the filter is a value: the dashboard's
base filter (`ray_io_cluster=~"$cluster"`) narrowed per row (`model="square"`)
and per target (`outcome!="ok"`). Grafana fills `$cluster`, `$model` and
`$__rate_interval` in when it runs the query.

>>> f = Filter.base().where(model="square")
>>> rate("ray_raybatch_batches_total", f)
'rate(ray_raybatch_batches_total{ray_io_cluster=~"$cluster",model="square"}[$__rate_interval])'
"""

from __future__ import annotations

from dataclasses import dataclass

CLUSTER_LABEL = "ray_io_cluster"  # set per cluster by KubeRay's PodMonitor (Ray's convention)
RATE_WINDOW = "$__rate_interval"


def _quote(value: str) -> str:
    return '"' + value.replace("\\", "\\\\").replace('"', '\\"') + '"'


@dataclass(frozen=True, slots=True)
class Filter:
    """Label matchers every selector of an expression carries."""

    matchers: tuple[str, ...] = ()

    @classmethod
    def base(cls) -> Filter:
        """What every expression of the dashboard is narrowed to: the chosen cluster."""
        return cls((f"{CLUSTER_LABEL}=~{_quote('$cluster')}",))

    def where(self, **labels: str) -> Filter:
        return Filter(self.matchers + tuple(f"{k}={_quote(v)}" for k, v in labels.items()))

    def matching(self, **patterns: str) -> Filter:
        return Filter(self.matchers + tuple(f"{k}=~{_quote(v)}" for k, v in patterns.items()))

    def excluding(self, **labels: str) -> Filter:
        return Filter(self.matchers + tuple(f"{k}!={_quote(v)}" for k, v in labels.items()))

    def __str__(self) -> str:
        return "{" + ",".join(self.matchers) + "}"


def series(metric: str, f: Filter) -> str:
    return f"{metric}{f}"


def rate(metric: str, f: Filter, window: str = RATE_WINDOW) -> str:
    return f"rate({series(metric, f)}[{window}])"


def increase(metric: str, f: Filter, window: str = RATE_WINDOW) -> str:
    return f"increase({series(metric, f)}[{window}])"


def sum_by(labels: tuple[str, ...], expr: str) -> str:
    """`sum(expr)`, or `sum by (a, b) (expr)`."""
    return f"sum by ({', '.join(labels)}) ({expr})" if labels else f"sum({expr})"


def quantile(q: float, histogram: str, f: Filter, by: tuple[str, ...] = ()) -> str:
    """The q-quantile of histogram `histogram` (its base name) over the rate window."""
    return f"histogram_quantile({q}, {sum_by(('le', *by), rate(histogram + '_bucket', f))})"
