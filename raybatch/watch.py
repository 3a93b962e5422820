"""`raybatch status --watch`: a live view of each model in the terminal, without Grafana.

Every `--interval` seconds it asks the app's ingress for the batching actors'
statistics (the same call as `raybatch status`) and shows, per model, what
changed since the previous look: requests and errors per second, what is queued,
how full the batches were (items per batch against the batch limit; sequences per
step for a generative model), the p50 and p99 queue wait (from the actors'
bucketed waits, interpolated as Prometheus's histogram_quantile does), and the
replicas running (and on how many nodes) and pending. The first frame has no
previous look: rates are "-", fill and waits cover the app's lifetime. The views are
plain functions of two statistics dicts, so they are tested without Ray.
"""

from __future__ import annotations

import argparse
import sys
import time
from dataclasses import dataclass
from typing import Any

from batching.stats import quantile

HEADER = ("MODEL", "KIND", "REQ/S", "ERR/S", "QUEUED", "BATCH FILL", "WAIT p50", "WAIT p99",
          "REPLICAS")
CLEAR = "\x1b[H\x1b[2J"


@dataclass(frozen=True, slots=True)
class ModelView:
    model: str
    kind: str
    req_s: float | None
    err_s: float | None
    queued: str
    fill: float | None  # 0..1 of the batch limit
    limit: int | None
    wait_p50_s: float | None
    wait_p99_s: float | None
    running: int
    pending: int
    nodes: int = 0  # the nodes the running replicas are on (0: not reported)


def _ended(s: dict[str, Any]) -> tuple[float, float]:
    """(requests ended, of which failed) so far, in the model's engine's terms."""
    if s.get("kind") == "iterative":  # a cancelled generation ended, but did not fail
        failed = s.get("failed", 0)
        return s.get("completed", 0) + failed + s.get("cancelled", 0), failed
    ok, ended_badly = s.get("success", {}).get("count", 0), s.get("fail", {}).get("count", 0)
    return ok + ended_badly, ended_badly - s.get("cancelled", 0)  # "fail" holds the cancels


def _per_batch(s: dict[str, Any]) -> tuple[float, float]:
    """(items or sequence-steps, batches or steps) so far."""
    if s.get("kind") == "iterative":
        return s.get("mean_active_per_step", 0.0) * s.get("steps", 0), s.get("steps", 0)
    return s.get("items", 0), s.get("batches", 0)


def _queued(s: dict[str, Any]) -> str:
    if s.get("kind") == "iterative":
        return str(s.get("waiting", 0))
    requests, items = s.get("queued_requests", 0), s.get("queued_items")
    return f"{requests} ({items})" if items is not None and items != requests else str(requests)


def model_view(model: str, cur: dict[str, Any], prev: dict[str, Any] | None,
               dt_s: float | None) -> ModelView:
    """What changed for `model` between two looks `dt_s` apart (prev None: the first)."""
    base = prev or {}
    ended, failed = _ended(cur)
    ended0, failed0 = _ended(base)
    items, batches = _per_batch(cur)
    items0, batches0 = _per_batch(base)
    hist = cur.get("queue_hist") or []
    hist0 = base.get("queue_hist") or [0] * len(hist)
    waits = [a - b for a, b in zip(hist, hist0)]
    limit = cur.get("batch_limit")
    fill = ((items - items0) / (batches - batches0) / limit
            if limit and batches > batches0 else None)
    rate = prev is not None and dt_s
    states = [r.get("state", "") for r in cur.get("replica_info", [])]
    return ModelView(
        model, cur.get("kind", "dynamic"),
        (ended - ended0) / dt_s if rate else None, (failed - failed0) / dt_s if rate else None,
        _queued(cur), fill, limit, quantile(0.5, waits), quantile(0.99, waits),
        sum(st == "ALIVE" for st in states), sum(st == "PENDING" for st in states),
        len({r["node_id"] for r in cur.get("replica_info", [])
             if r.get("state") == "ALIVE" and r.get("node_id")}))


def duration(seconds: float | None) -> str:
    """0.00042 -> '420 us', 0.0123 -> '12.3 ms', 2.5 -> '2.50 s'."""
    if seconds is None:
        return "-"
    if seconds < 1e-3:
        return f"{seconds * 1e6:.0f} us"
    if seconds < 1.0:
        return f"{seconds * 1e3:.1f} ms"
    return f"{seconds:.2f} s"


def _rate(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"


def row(v: ModelView) -> tuple[str, ...]:
    fill = "-" if v.fill is None else f"{v.fill:.0%} of {v.limit}"
    replicas = str(v.running) + (f" +{v.pending} pending" if v.pending else "") + (
        f" on {v.nodes} node{'s' if v.nodes > 1 else ''}" if v.nodes else "")
    return (v.model, v.kind, _rate(v.req_s), _rate(v.err_s), v.queued, fill,
            duration(v.wait_p50_s), duration(v.wait_p99_s), replicas)


def render(app: str, views: list[ModelView], interval_s: float, at: str) -> str:
    """One frame: a title line, then a table of one row per model."""
    rows = [HEADER, *(row(v) for v in views)]
    widths = [max(len(r[i]) for r in rows) for i in range(len(HEADER))]
    right = {2, 3, 6, 7}  # numbers line up on the right
    lines = [f"{app}   every {interval_s:g} s   {at}   (Ctrl-C to stop)", ""]
    for r in rows:
        cells = [c.rjust(w) if i in right else c.ljust(w)
                 for i, (c, w) in enumerate(zip(r, widths))]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines) + "\n"


def frames(app: str, fetch: Any, interval_s: float, count: int = 0,
           clock: Any = time.monotonic, sleep: Any = time.sleep, wall: Any = time.strftime):
    """Yield rendered frames: `fetch()` every `interval_s`, `count` times (0: forever)."""
    prev, prev_t, n = None, None, 0
    while True:
        stats, now = fetch(), clock()
        dt = now - prev_t if prev_t is not None else None
        views = [model_view(m, s, (prev or {}).get(m) if prev else None, dt)
                 for m, s in stats.items()]
        yield render(app, views, interval_s, wall("%H:%M:%S"))
        prev, prev_t, n = stats, now, n + 1
        if count and n >= count:
            return
        sleep(interval_s)


def run(args: argparse.Namespace) -> int:
    """`raybatch status --watch`: redraw in place on a terminal, else print frame after frame."""
    from raybatch.apphandle import app_handle

    handle = app_handle(args)
    tty = sys.stdout.isatty()

    def fetch() -> dict[str, Any]:
        return handle.status.remote().result(timeout_s=30)

    try:
        for frame in frames(args.app, fetch, args.interval, args.count):
            sys.stdout.write((CLEAR if tty else "") + frame + ("" if tty else "\n"))
            sys.stdout.flush()
    except KeyboardInterrupt:
        pass
    return 0
