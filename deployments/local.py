"""`LocalApp`: a local Ray of its own, Serve on 127.0.0.1, one Raybatch app; always torn down.

For notebooks and scripts that want the whole cluster path on one machine and
must leave nothing behind. `start()` starts a *new* local Ray (`address="local"`:
it never joins a cluster already running here, such as a test session's), Serve
on a free port of 127.0.0.1 unless one is given, and deploys the config.
A machine too busy for Ray's fixed startup waits gets the start tried again
(`cluster.localray`). `close()` deletes the app, shuts Serve down and shuts Ray down, running every
step even when an earlier one fails, once. It also runs at interpreter exit, so
a notebook whose cell failed still tears down when its kernel stops.

Ray exports the raybatch_* series (`deployments.metrics`) on a free port of its
own, reported every `metrics_report_interval_s` (Ray's default, 10 s, is long to
wait in a notebook); `metrics()` reads them back as Prometheus would scrape them
(`MetricsSample`). With `grpc=True` Serve's gRPC proxy serves the KServe v2 /
Triton service on `grpc_port` (`tritonclient.grpc`).

    with LocalApp(config, num_cpus=2) as app:
        print(app.url)                                   # http://127.0.0.1:PORT
        out = await app.handle.infer.remote("square", {"INPUT0": x})
        m = app.metrics(until=lambda m: m.total("raybatch_requests_total") > 0)
"""

from __future__ import annotations

import atexit
import logging
import math
import time
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from cluster.config import RaybatchConfig
from cluster.localray import start_local
from cluster.ports import free_port
from deployments.metrics import PREFIX

log = logging.getLogger(__name__)


def run_all(steps: Sequence[tuple[str, Callable[[], Any]]]) -> None:
    """Run every step in order; then raise the first failure, naming its step."""
    first: tuple[str, BaseException] | None = None
    for name, step in steps:
        try:
            step()
        except BaseException as e:  # the later steps must still run
            log.warning("teardown step %r failed: %r", name, e)
            first = first or (name, e)
    if first is not None:
        raise RuntimeError(f"teardown step {first[0]!r} failed: {first[1]!r}") from first[1]


@dataclass(frozen=True, slots=True)
class MetricsSample:
    """The raybatch_* samples of one scrape, named as `deployments.metrics.SERIES` names
    them (without Ray's `ray_` prefix); sums run over Ray's own labels (workers...)."""

    samples: tuple[tuple[str, dict[str, str], float], ...]

    @classmethod
    def parse(cls, text: str) -> MetricsSample:
        """From Prometheus's text format, keeping the `ray_raybatch_*` samples."""
        from prometheus_client.parser import text_string_to_metric_families

        return cls(tuple(
            (s.name.removeprefix(PREFIX), s.labels, s.value)
            for family in text_string_to_metric_families(text) for s in family.samples
            if s.name.startswith(PREFIX + "raybatch_")))

    def total(self, name: str, **labels: str) -> float:
        """Sum of `name`'s samples whose labels include `labels`."""
        return sum(v for n, lab, v in self.samples if n == name and labels.items() <= lab.items())

    def by(self, name: str, label: str, **labels: str) -> dict[str, float]:
        """`name`'s sum per value of `label` (e.g. batches per flush reason), zeros left out."""
        out: dict[str, float] = {}
        for n, lab, v in self.samples:
            if n == name and label in lab and labels.items() <= lab.items():
                out[lab[label]] = out.get(lab[label], 0.0) + v
        return {k: v for k, v in out.items() if v}

    def histogram(self, name: str, **labels: str) -> dict[float, float]:
        """Observations per bucket of histogram `name` (upper bound -> count, not cumulative),
        from its `_bucket{le}` series."""
        cumulative: dict[float, float] = {}
        for le, v in self.by(name + "_bucket", "le", **labels).items():
            cumulative[float(le)] = cumulative.get(float(le), 0.0) + v
        bounds = sorted(cumulative)
        counts = [cumulative[b] for b in bounds]
        return {b: c - p for b, c, p in zip(bounds, counts, [0.0, *counts[:-1]])}


def bucket_names(bounds: Sequence[float]) -> list[str]:
    """Labels for histogram buckets of counts from 1: (1, 2, 4, 8, inf) -> 1, 2, 3-4, 5-8, >8."""
    names, low = [], 0.0
    for b in bounds:
        if b == math.inf:
            names.append(f">{low:g}")
        elif math.floor(low) + 1 >= b:
            names.append(f"{b:g}")
        else:
            names.append(f"{math.floor(low) + 1:g}-{b:g}")
        low = b
    return names


class LocalApp:
    """A local Ray (`num_cpus`), Serve on `host:port`, and the app of `config`."""

    def __init__(self, config: RaybatchConfig, *, num_cpus: int = 2, host: str = "127.0.0.1",
                 port: int | None = None, grpc: bool = False,
                 metrics_report_interval_s: float = 1.0, quiet: bool = True) -> None:
        self.config = config
        self.num_cpus = num_cpus
        self.host = host
        self.port = port
        self.grpc = grpc
        self.grpc_port: int | None = None  # Serve's gRPC proxy, once started with grpc=True
        self.metrics_port: int | None = None  # Ray's metrics export, once started
        self.metrics_report_interval_s = metrics_report_interval_s
        self.quiet = quiet
        self.handle: Any = None  # the ingress DeploymentHandle, once started
        self._started = False
        self._closed = False

    @property
    def url(self) -> str:
        """Where the app answers HTTP, without a trailing slash."""
        prefix = self.config.ingress.route_prefix.rstrip("/")
        return f"http://{self.host}:{self.port}{prefix}"

    @property
    def metrics_url(self) -> str:
        """Ray's metrics endpoint on this node (what Prometheus scrapes)."""
        return f"http://127.0.0.1:{self.metrics_port}/metrics"

    def metrics(self, until: Callable[[MetricsSample], bool] | None = None,
                timeout_s: float = 30.0, every_s: float = 0.5) -> MetricsSample:
        """The raybatch_* series now; with `until`, scraped again until it holds (the
        series lag the traffic by up to metrics.interval_s + the report interval)."""
        give_up = time.monotonic() + timeout_s
        while True:
            with urllib.request.urlopen(self.metrics_url, timeout=10) as r:
                m = MetricsSample.parse(r.read().decode())
            if until is None or until(m):
                return m
            if time.monotonic() > give_up:
                raise TimeoutError(f"the metrics at {self.metrics_url} did not reach what "
                                   f"was waited for in {timeout_s:g} s; raise timeout_s")
            time.sleep(every_s)

    def start(self) -> LocalApp:
        import ray
        from ray import serve

        from deployments.app import build_app

        if self._started:
            raise RuntimeError("a LocalApp starts once: create another one")
        self._started = True
        atexit.register(self.close)  # a failed cell stops the kernel, which runs this
        if self.port is None:
            self.port = free_port(self.host)
        self.metrics_port = free_port()
        grpc: dict[str, Any] = {}
        if self.grpc:
            from deployments.grpc import SERVICER_FUNCTIONS

            self.grpc_port = free_port(self.host)
            grpc = {"grpc_options": {"port": self.grpc_port,
                                     "grpc_servicer_functions": SERVICER_FUNCTIONS}}
        if self.quiet:  # Serve logs every deployment step to the driver
            logging.getLogger("ray.serve").setLevel(logging.WARNING)
        try:
            interval_ms = round(self.metrics_report_interval_s * 1000)
            start_local(ray.init, say=log.warning, address="local", num_cpus=self.num_cpus,
                        include_dashboard=False, log_to_driver=not self.quiet,
                        logging_level=logging.WARNING, _metrics_export_port=self.metrics_port,
                        _system_config={"metrics_report_interval_ms": interval_ms})
            serve.start(http_options={"host": self.host, "port": self.port}, **grpc)
            self.handle = serve.run(build_app(self.config), name=self.config.app_name,
                                    route_prefix=self.config.ingress.route_prefix)
        except BaseException:
            self.close()
            raise
        return self

    def close(self) -> None:
        """Delete the app, stop Serve, stop Ray: each step runs, once."""
        if self._closed or not self._started:
            return
        self._closed = True
        atexit.unregister(self.close)
        import ray
        from ray import serve

        if not ray.is_initialized():
            return
        run_all([
            ("delete the app", lambda: serve.delete(self.config.app_name)),
            ("shut Serve down", serve.shutdown),
            ("shut Ray down", ray.shutdown),
        ])

    def __enter__(self) -> LocalApp:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
