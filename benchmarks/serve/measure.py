"""How `benchmarks.serve.compare` measures one system at one point, and what it reads back.

Handle points run `benchmarks.common.loadgen.run_closed_loop` on this process's loop;
HTTP points run `wrk` (`benchmarks.common.wrk`) in a thread, a warm-up run then the
measured one. Either way the CPU of every Ray process is read from /proc at
the window's edges and reported per request: by process title, by process group
(`benchmarks.serve.drivers.group_of`), for the system's own processes, and with
the HTTP front added (Serve proxy or HAProxy). Batch counts come from the
system's own statistics (`stats()` for the Serve baselines, `status()` for
Raybatch), read through its handle.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from benchmarks.serve.models import BenchModel
from benchmarks.serve.settings import Settings


def cpu_fields(out: dict[str, Any], by_title: dict[str, float] | None, n: int, app: str,
                raybatch: bool) -> None:
    """CPU us per request: all Ray processes, by process, by group, and the system's own."""
    from benchmarks.serve.drivers import FRONTS, cpu_by_group, own_cpu_s

    per = (lambda v: v / n * 1e6) if n else (lambda v: float("nan"))
    out["server_cpu_s"] = None if by_title is None else sum(by_title.values())
    out["server_cpu_us_per_req"] = None if by_title is None or not n else per(
        out["server_cpu_s"])
    out["server_cpu_us_per_req_by_process"] = {
        k: per(v) for k, v in sorted((by_title or {}).items(), key=lambda kv: -kv[1])
        if n and per(v) >= 1}
    groups = cpu_by_group(by_title or {})
    out["cpu_us_per_req_by_group"] = {k: per(v) for k, v in sorted(
        groups.items(), key=lambda kv: -kv[1]) if n and per(v) >= 1}
    own = own_cpu_s(groups, app, raybatch)
    front = sum(groups.get(g, 0.0) for g in FRONTS)
    out["own_cpu_us_per_req"] = per(own)
    out["own_and_front_cpu_us_per_req"] = per(own + front)


async def measure(submit: Any, payloads: list[Any], fetch: Any, c: int,
                  s: Settings, app: str = "", raybatch: bool = False) -> dict[str, Any]:
    from benchmarks.common.loadgen import run_closed_loop
    from benchmarks.serve.drivers import StatsPoller

    async with StatsPoller(fetch) as poller:
        r = await run_closed_loop(submit, payloads, concurrency=c, duration_s=s.duration_s,
                                  warmup_s=s.warmup_s, stats=poller)
    out = r.as_dict()
    cpu_fields(out, poller.server_cpu_s(), r.requests, app, raybatch)
    return out


async def measure_wrk(url: str, body: tuple[bytes, dict[str, str]], fetch: Any, c: int,
                      s: Settings, app: str, raybatch: bool) -> dict[str, Any]:
    """One HTTP point driven by wrk: a warm-up run, then the measured one."""
    from benchmarks.common.wrk import run_wrk
    from benchmarks.serve.drivers import tree_cpu_s

    data, headers = body
    if not s.disconnect_watch:
        headers = {**headers, "x-request-disconnect-disabled": "?1"}
    await asyncio.to_thread(run_wrk, url, data, headers, connections=c,
                            duration_s=s.warmup_s)
    before, cpu0 = await fetch(), tree_cpu_s(os.getpid())
    r = await asyncio.to_thread(run_wrk, url, data, headers, connections=c,
                                duration_s=s.duration_s)
    cpu1, after = tree_cpu_s(os.getpid()), await fetch()
    out = r.as_dict()
    out["concurrency"] = c
    batches = after.get("batches", 0) - before.get("batches", 0)
    out["batches"] = batches
    out["mean_batch_size"] = (after.get("items", 0) - before.get("items", 0)) / batches \
        if batches else None
    by_title = {k: cpu1[k] - cpu0.get(k, 0.0) for k in cpu1 if cpu1[k] - cpu0.get(k, 0.0) > 0}
    cpu_fields(out, by_title, r.requests, app, raybatch)
    return out


def fetchers(model: BenchModel, handles: dict[str, Any]) -> dict[str, Any]:
    def raybatch(h: Any) -> Any:
        async def fetch() -> dict[str, Any]:
            return (await h.status.remote())[model.name]
        return fetch

    def serve_stats(h: Any) -> Any:
        async def fetch() -> dict[str, Any]:
            return await h.stats.remote()
        return fetch

    return {system: (raybatch if system.startswith("rb:") else serve_stats)(h)
            for system, h in handles.items()}


def handle_submits(model: BenchModel, handles: dict[str, Any]) -> dict[str, Any]:
    from deployments.ingress.client import RaybatchClient

    name = model.name

    def serve_infer(h: Any) -> Any:
        async def submit(x: Any) -> Any:
            return await h.infer.remote(x)
        return submit

    def raybatch(h: Any) -> Any:
        async def submit(x: Any) -> Any:
            return await h.infer.remote(name, {"INPUT0": x})
        return submit

    def raybatch_client(h: Any) -> Any:
        client = RaybatchClient(h)

        async def submit(x: Any) -> Any:
            return await client.infer(name, {"INPUT0": x})
        return submit

    out = {}
    for system, h in handles.items():
        if system.startswith("rb:"):
            out[system] = raybatch(h)
            out[f"{system}/client"] = raybatch_client(h)
        else:
            out[system] = serve_infer(h)
    return out
