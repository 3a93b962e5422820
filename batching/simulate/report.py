"""What a simulation measured, as numbers (`as_dict`, for JSON) and as text (`format`).

Latencies are in milliseconds because that is how people read them; the
batch-size histogram keeps one bar per size while it fits a screen and groups
sizes by powers of two beyond that.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import asdict, dataclass

import numpy as np

_LATENCY_KEYS = ("p50", "p95", "p99", "mean", "max")


@dataclass(frozen=True)
class SimReport:
    """Throughput, latency and batching of one simulation, over its measurement window."""

    window_s: float
    arrived: int  # requests that arrived in the window
    completed: int  # of those, ended with a result
    failed: dict[str, int]  # of those, ended with an error, by error class
    unfinished: int  # of those, never ended: the batcher stopped serving them
    throughput_rps: float  # requests that ended with a result in the window, per second
    throughput_items_per_s: float
    latency_ms: dict[str, float | None]  # p50, p95, p99, mean, max; None without completions
    batches: int  # formed from warmup_s on, those serving the last requests included
    mean_batch_size: float
    batch_sizes: dict[int, int]
    flush_reasons: dict[str, int]
    utilization: float  # fraction of the window the replicas spent computing

    def as_dict(self) -> dict:
        return asdict(self)

    def format(self) -> str:
        """The readable report `raybatch simulate` prints."""
        lat = "  ".join(f"{k} {_ms(v)}" for k, v in self.latency_ms.items())
        failed = ", ".join(f"{n} {k}" for k, n in sorted(self.failed.items())) or "0"
        share = 100 / max(self.batches, 1)
        reasons = "  ".join(f"{k} {n} ({n * share:.1f}%)" for k, n in self.flush_reasons.items())
        return "\n".join([
            f"window        {self.window_s:.3f} s: {self.arrived} requests arrived, "
            f"{self.completed} completed, {failed} failed, {self.unfinished} unfinished",
            f"throughput    {self.throughput_rps:.1f} requests/s  "
            f"{self.throughput_items_per_s:.1f} items/s  "
            f"replicas busy {100 * self.utilization:.1f}%",
            f"latency (ms)  {lat}",
            f"batches       {self.batches}, mean size {self.mean_batch_size:.2f}",
            f"flush reasons {reasons or '-'}",
            "batch sizes",
            *histogram(self.batch_sizes),
        ])


def latency_summary_ms(latencies_s: list[float]) -> dict[str, float | None]:
    """p50, p95, p99, mean and max in milliseconds; all None for no samples.

    >>> latency_summary_ms([0.001, 0.003])["p50"]
    2.0
    """
    if not latencies_s:
        return dict.fromkeys(_LATENCY_KEYS)
    ms = np.asarray(latencies_s) * 1e3
    p50, p95, p99 = (float(v) for v in np.percentile(ms, (50, 95, 99)))
    values = (p50, p95, p99, float(ms.mean()), float(ms.max()))
    return {k: round(v, 6) for k, v in zip(_LATENCY_KEYS, values)}  # to the nanosecond


def histogram(sizes: dict[int, int], width: int = 40, rows: int = 16) -> list[str]:
    """Text bars of batch counts by size, by power-of-two ranges when sizes exceed `rows`.

    >>> histogram({1: 1, 4: 2}, width=4)
    ['  1 | ##   1', '  4 | #### 2']
    """
    if not sizes:
        return ["  (no batches)"]
    if len(sizes) <= rows:
        bins = {str(k): n for k, n in sorted(sizes.items())}
    else:
        grouped: Counter = Counter()
        for k, n in sizes.items():
            grouped[1 << (k.bit_length() - 1)] += n
        bins = {f"{lo}-{2 * lo - 1}": grouped[lo] for lo in sorted(grouped)}
    top, label = max(bins.values()), max(len(k) for k in bins)
    return [f"  {k:>{label}} | {_bar(n, top, width):<{width}} {n}" for k, n in bins.items()]


def _bar(n: int, top: int, width: int) -> str:
    return "#" * max(1, round(width * n / top))


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"
