"""Every PromQL expression of the dashboard, answered by a real Prometheus scraping Ray.

A Prometheus (Debian's `prometheus` package; skipped with an install hint where
the binary is missing) scrapes the session Ray's metrics port every 10 s while
every model of the shared app gets a little traffic. Then each expression of the
dashboard rendered from the app's config, with the dashboard's variables filled
in as Grafana would ("All" for cluster and model), must return data: at least
one series with a finite value over the traffic's time range. A misspelled series
or label, a counter that never appears, or a histogram without buckets fails here.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
from pathlib import Path

import numpy as np
import pytest

from cluster.grafana.dashboard import expressions, render_dashboard
from tests.conftest import METRICS_PORT, free_port, wait_until

pytestmark = pytest.mark.integration
# Ray's endpoint can take over a second to render late in the suite (every series of
# every app the session deployed), and several times that while the other lane's lab
# hosts hold most of the CPU: runs have seen every scrape miss a 1 s timeout, and 20 in a
# row miss a 3 s one. Prometheus wants the timeout within the interval: 10 s for both.
SCRAPE_S = 10
RATE_WINDOW = f"{4 * SCRAPE_S}s"  # $__rate_interval: Grafana takes at least 4 scrape intervals
VARIABLES = {"$__rate_interval": RATE_WINDOW, "$cluster": ".*", "$model": ".*"}
INSTALL_HINT = ("Prometheus is not installed: `sudo apt-get install prometheus` (Debian/Ubuntu; "
                "`make setup` does it when run as root), or put a prometheus binary on PATH")


def get_json(url: str) -> dict:
    with urllib.request.urlopen(url, timeout=10) as r:
        return json.loads(r.read())


@pytest.fixture(scope="module")
def prometheus(ray_address, tmp_path_factory):
    binary = shutil.which("prometheus")
    if binary is None:
        pytest.skip(INSTALL_HINT)
    home = tmp_path_factory.mktemp("prometheus")
    config = home / "prometheus.yml"
    config.write_text(
        f"global: {{scrape_interval: {SCRAPE_S}s, scrape_timeout: {SCRAPE_S}s, "
        f"evaluation_interval: {SCRAPE_S}s}}\n"
        "scrape_configs:\n"
        "  - job_name: ray\n"
        f"    static_configs: [{{targets: ['127.0.0.1:{METRICS_PORT}']}}]\n")
    port = free_port()
    proc = subprocess.Popen(
        [binary, f"--config.file={config}", f"--storage.tsdb.path={home / 'data'}",
         f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
        stdout=subprocess.DEVNULL, stderr=(home / "log").open("w"))
    url = f"http://127.0.0.1:{port}"
    try:
        wait_until(lambda: _ready(url, proc, home), timeout_s=30, every_s=0.2,
                   what="Prometheus to start")
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()


def _ready(url: str, proc: subprocess.Popen, home: Path) -> bool:
    if proc.poll() is not None:
        pytest.fail(f"prometheus exited {proc.returncode}: {(home / 'log').read_text()[-2000:]}")
    try:
        return urllib.request.urlopen(url + "/-/ready", timeout=2).status == 200
    except OSError:
        return False


def example_inputs(m) -> dict[str, np.ndarray]:
    """Two items for every declared input of `m` (variable dims of 3)."""
    from deployments.protocol.datatypes import NUMPY_DTYPES

    out = {}
    for t in m.inputs:
        shape = (2, *(3 if d == -1 else d for d in t.shape[1:]))
        out[t.name] = (np.full(shape, b"x", dtype=object) if t.datatype == "BYTES"
                       else np.ones(shape, dtype=NUMPY_DTYPES[t.datatype]))
    return out


def traffic(app, seconds: float) -> None:
    """A little of everything the dashboard shows, to every model of the app, and HTTP
    (a good request and a 404) to the ingress's HTTP panels."""
    from tests.integration.test_metrics import send_http

    h = app.handle
    give_up, round_ = time.monotonic() + seconds, 0
    while time.monotonic() < give_up:
        calls = []
        for m in app.config.models:
            kind, shape = m.batching.kind, m.inputs[0].shape
            if kind == "dynamic":
                calls.append(h.infer_bundle.remote(m.name, [example_inputs(m)] * 8))
            elif kind == "sequence":
                dtype = np.int32 if m.inputs[0].datatype == "INT32" else np.float32
                x = np.ones((1, *shape[1:]), dtype=dtype)
                for i in range(4):
                    calls.append(h.infer.remote(m.name, {"INPUT0": x}, {
                        "sequence_id": f"prom-{round_}-{i}", "sequence_start": True,
                        "sequence_end": True}))
            else:
                calls += [h.generate.remote(m.name, "Once upon", {"max_tokens": 6})
                          for _ in range(3)]
        send_http(app.base_url if round_ % 2 else app.direct_url, 1)
        for call in calls:
            call.result(timeout_s=60)
        round_ += 1


def _diagnosis(url: str, start: float) -> str:
    """What Prometheus and Ray's endpoint hold of the queue-wait histogram (for a failure)."""
    lines = []
    for expr in ("count by (model, level) (ray_raybatch_queue_wait_seconds_count)",
                 "sum by (model) (ray_raybatch_queue_wait_seconds_count)",
                 f"sum by (model) (rate(ray_raybatch_queue_wait_seconds_count[{RATE_WINDOW}]))",
                 "up", "scrape_duration_seconds", "scrape_samples_scraped",
                 "sum(ray_raybatch_requests_total)"):
        try:
            got = query_range(url, expr, start, time.time())
            lines.append(f"{expr}: " + "; ".join(
                f"{r['metric']} last={r['values'][-1][1]} n={len(r['values'])}" for r in got[:8]))
        except Exception as e:  # the diagnosis must not hide the failure
            lines.append(f"{expr}: {e!r}")
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{METRICS_PORT}/metrics", timeout=10) as r:
            text = r.read().decode()
        wait = [line for line in text.splitlines() if "queue_wait_seconds_count" in line]
        lines.append(f"Ray's endpoint: {len(text.splitlines())} lines, queue_wait counts: "
                     + " | ".join(wait[:6]))
    except Exception as e:
        lines.append(f"Ray's endpoint: {e!r}")
    return "\n".join(lines)


def query_range(url: str, expr: str, start: float, end: float) -> list[dict]:
    q = urllib.parse.urlencode({"query": expr, "start": start, "end": end, "step": SCRAPE_S})
    answer = get_json(f"{url}/api/v1/query_range?{q}")
    assert answer["status"] == "success", answer
    return answer["data"]["result"]


def finite(result: list[dict]) -> bool:
    return any(math.isfinite(float(v)) for series in result for _, v in series["values"])


def test_every_dashboard_expression_returns_data_from_a_real_prometheus(app, prometheus):
    start = time.time()
    traffic(app, seconds=6)
    exprs = expressions(render_dashboard(app.config))
    substituted = []
    for title, expr in exprs:
        for name, value in VARIABLES.items():
            expr = expr.replace(name, value)
        assert "$" not in expr, expr
        substituted.append((title, expr))
    # Ray reports every 2 s and Prometheus scrapes every SCRAPE_S: give the points time to land.
    # Traffic goes on meanwhile: a quantile over rate() is NaN once the traffic stops, so
    # a series that first reached Prometheus after the traffic (a process that started late,
    # a loaded metrics agent) would never answer the probe.
    probe = next(e for t, e in substituted if "histogram_quantile" in e)

    def probe_answers() -> bool:
        if finite(query_range(prometheus, probe, start, time.time())):
            return True
        traffic(app, seconds=1)
        return False

    give_up = time.monotonic() + 12 * SCRAPE_S  # a bound against a hang, not a speed
    while not probe_answers():
        if time.monotonic() > give_up:
            pytest.fail(f"timed out after {12 * SCRAPE_S} s waiting for the traffic to reach "
                        f"Prometheus: {probe}\n{_diagnosis(prometheus, start)}")

    def still_missing(exprs: list) -> list:
        end = time.time()
        return [(t, e) for t, e in exprs if not finite(query_range(prometheus, e, start - 10, end))]

    def landed(exprs: list) -> list:
        """What of `exprs` still has no data once the last points had time to land (two
        scrapes and a report): looked at every scrape, the last look no sooner than that."""
        last_look = time.monotonic() + 2 * SCRAPE_S + 2
        while (exprs := still_missing(exprs)) and time.monotonic() < last_look:
            time.sleep(SCRAPE_S)
        return exprs

    # A series of a process that started late (a replica's first report) can miss the
    # first window: more traffic and another look, for at most 8 scrapes, before it counts.
    missing, give_up = landed(substituted), time.monotonic() + 8 * SCRAPE_S
    while missing and time.monotonic() < give_up:
        traffic(app, seconds=3)
        missing = landed(missing)
    assert not missing, f"{len(missing)} of {len(substituted)} expressions returned no data: " \
                        + "\n".join(f"{t}: {e}" for t, e in missing[:20])
    assert len(substituted) > 100
