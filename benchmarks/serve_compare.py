"""Raybatch against Ray Serve without batching and with `@serve.batch`, in one local Ray.

    python -m benchmarks.serve_compare [--models sleep mlp minilm] [--concurrency 1 16 128 512]
        [--duration S] [--quick] [--json OUT] [--port 8100] [--paths handle http]
        [--ingress direct proxy haproxy] [--probes] [--isolate-model-core] [--json-http]

Per model, three one-replica apps run side by side on one Serve HTTP port: `serve`
(no batching), `serve.batch` (`@serve.batch`, same max batch size and delay) and
`raybatch` (`deployments.app.build_app`); see `benchmarks.serve_apps` for what is
kept equal. Each is driven closed-loop at every C through its handle (and Raybatch
also through `RaybatchClient`) and over HTTP (binary OIP tensors both ways, the
same codec on all three). Reported per point: throughput, p50/p99, mean batch size,
CPU per request of the client and of all Ray processes, the 1-minute load.

Serve's fastest documented configuration is used: `RAY_SERVE_THROUGHPUT_OPTIMIZED=1`
is put in the environment before `ray` is imported (Serve reads it at import, in
this process and, inherited, in every Ray worker). It turns on direct ingress, so
`--ingress direct` (the default) sends HTTP straight to each app's ingress replica
port; `proxy` turns direct ingress off and goes through Serve's proxy; `haproxy`
sets `RAY_SERVE_ENABLE_HA_PROXY=1` and goes through HAProxy. With more than one,
each variant runs in a fresh Ray in its own process.

minilm's model replica is pinned to one core in all three systems, and so is the
offline encode it is compared with: every thread of the replica's process, which
for the Serve baselines is also where HTTP and batching run (their architecture)
and for Raybatch is the model replica alone. Everything else floats over all
cores, unless `--isolate-model-core` keeps it off that core. Each model's ceiling
is measured again just before each concurrency point, with the apps idle.

Full run: about 8 minutes for one variant on 2 cores (490 s measured); `--quick`
(C = 1 and the targets' points, 1 s windows) about 2 minutes, noisier. `--probes`
adds the rows of `benchmarks.serve_probes` (not product paths) and a hop-latency
table; `--ingress direct proxy haproxy` runs each variant in turn (~8 min each).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, replace
from typing import Any

from benchmarks.serve_models import BenchModel, bench_models, ceiling, raybatch_config
from benchmarks.serve_report import LATENCY_C, MINILM_C, SLEEP_C, render, targets

CONCURRENCIES = (1, 16, 128, 512)
VARIANTS = ("direct", "proxy", "haproxy")
APPS = {"serve": ("serve-plain", "/plain"), "serve.batch": ("serve-batch", "/batched"),
        "raybatch": ("raybatch", "/raybatch")}


@dataclass(frozen=True, slots=True)
class Settings:
    warmup_s: float
    duration_s: float
    ceiling_s: float
    concurrencies: tuple[int, ...] | None = None  # None: CONCURRENCIES + each target's C
    paths: tuple[str, ...] = ("handle", "http")
    port: int = 8100
    ingress: str = "direct"
    binary_http: bool = True
    probes: bool = False
    isolate: bool = False  # keep all but the model replicas off the model's core
    quick: bool = False


FULL = Settings(warmup_s=1.0, duration_s=3.0, ceiling_s=1.0)
QUICK = Settings(warmup_s=0.5, duration_s=1.0, ceiling_s=0.5,
                 concurrencies=(LATENCY_C, SLEEP_C), quick=True)


def configure_environment(s: Settings) -> None:
    """Serve's switches, read when `ray.serve` is imported: set them before that."""
    os.environ["RAY_SERVE_THROUGHPUT_OPTIMIZED"] = "1"
    os.environ["RAY_SERVE_ENABLE_DIRECT_INGRESS"] = "0" if s.ingress == "proxy" else "1"
    if s.ingress == "haproxy":
        os.environ["RAY_SERVE_ENABLE_HA_PROXY"] = "1"
    # Direct-ingress replicas take ports from these ranges: keep them beside the proxy's.
    for proto, lo in (("HTTP", 10), ("GRPC", 40)):
        os.environ.setdefault(f"RAY_SERVE_DIRECT_INGRESS_MIN_{proto}_PORT", str(s.port + lo))
        os.environ.setdefault(f"RAY_SERVE_DIRECT_INGRESS_MAX_{proto}_PORT", str(s.port + lo + 30))
    # Deleting an app would otherwise hold its direct-ingress replicas 30 s for a load
    # balancer to notice: there is none here.
    os.environ.setdefault("RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S", "0")
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch loads, here and in workers


def concurrencies(model: BenchModel, s: Settings) -> list[int]:
    """The points of `model`: minilm also gets its target's C=64 (in place of 128 when quick)."""
    cs = list(s.concurrencies or CONCURRENCIES)
    if model.name == "minilm" and SLEEP_C in cs:
        cs.append(MINILM_C)
        if s.quick:
            cs.remove(SLEEP_C)
    return sorted(set(cs))


# -- deploying ----------------------------------------------------------------------------------
def deploy(model: BenchModel) -> None:
    """The three apps of `model`, side by side (blocking: run it in a thread)."""
    from ray import serve

    from benchmarks.serve_apps import Batched, Plain, serve_app
    from cluster.config import load_config
    from deployments.app import build_app

    name, prefix = APPS["raybatch"]
    apps = {"serve": serve_app(Plain, model), "serve.batch": serve_app(Batched, model),
            "raybatch": build_app(load_config(raybatch_config(model, name, prefix)))}
    serve.run_many([serve.RunTarget(app, name=APPS[system][0], route_prefix=APPS[system][1])
                    for system, app in apps.items()])


def undeploy(timeout_s: float = 120.0) -> None:
    from ray import serve

    for name, _ in APPS.values():
        serve.delete(name, _blocking=False)
    give_up = time.monotonic() + timeout_s
    while set(serve.status().applications) & {name for name, _ in APPS.values()}:
        if time.monotonic() > give_up:
            raise TimeoutError(f"apps {sorted(serve.status().applications)} still deleting")
        time.sleep(0.2)


async def pin_raybatch_replica(handle: Any, model: BenchModel) -> None:
    """Pin every thread of the Raybatch model replica's process to the model's core."""
    from benchmarks.serve_models import pin_process

    if model.pin_core is None:
        return
    for replica in (await handle.status.remote())[model.name]["replica_info"]:
        pin_process(replica["pid"], model.pin_core)


# -- measuring ----------------------------------------------------------------------------------
async def measure(submit: Any, payloads: list[Any], fetch: Any, c: int,
                  s: Settings) -> dict[str, Any]:
    from benchmarks.loadgen import run_closed_loop
    from benchmarks.serve_drivers import StatsPoller

    async with StatsPoller(fetch) as poller:
        r = await run_closed_loop(submit, payloads, concurrency=c, duration_s=s.duration_s,
                                  warmup_s=s.warmup_s, stats=poller)
    out = r.as_dict()
    by_process = poller.server_cpu_s()
    n = r.requests
    out["server_cpu_s"] = None if by_process is None else sum(by_process.values())
    out["server_cpu_us_per_req"] = (out["server_cpu_s"] / n * 1e6
                                    if by_process is not None and n else None)
    out["server_cpu_us_per_req_by_process"] = {
        k: v / n * 1e6 for k, v in sorted((by_process or {}).items(), key=lambda kv: -kv[1])
        if n and v / n * 1e6 >= 1}
    return out


def _fetchers(model: BenchModel, handles: dict[str, Any]) -> dict[str, Any]:
    async def raybatch() -> dict[str, Any]:
        return (await handles["raybatch"].status.remote())[model.name]

    def serve_stats(h: Any) -> Any:
        async def fetch() -> dict[str, Any]:
            return await h.stats.remote()
        return fetch

    return {"serve": serve_stats(handles["serve"]),
            "serve.batch": serve_stats(handles["serve.batch"]), "raybatch": raybatch}


def _handle_submits(model: BenchModel, handles: dict[str, Any]) -> dict[str, Any]:
    from deployments.client import RaybatchClient

    client = RaybatchClient(handles["raybatch"])
    name = model.name

    def serve_infer(h: Any) -> Any:
        async def submit(x: Any) -> Any:
            return await h.infer.remote(x)
        return submit

    async def raybatch(x: Any) -> Any:
        return await handles["raybatch"].infer.remote(name, {"INPUT0": x})

    async def raybatch_client(x: Any) -> Any:
        return await client.infer(name, {"INPUT0": x})

    return {"serve": serve_infer(handles["serve"]),
            "serve.batch": serve_infer(handles["serve.batch"]),
            "raybatch": raybatch, "raybatch.client": raybatch_client}


@dataclass
class Drivers:
    """How one model's systems are driven: handle submits, HTTP URLs, batch-count fetchers."""

    submits: dict[str, Any]
    urls: dict[str, str]
    fetch: dict[str, Any]
    payloads: list[Any]
    bodies: list[Any]
    extra: dict[str, Any]


async def measure_model(model: BenchModel, s: Settings) -> dict[str, Any]:
    import ray

    t0 = time.perf_counter()
    await asyncio.to_thread(deploy, model)
    _progress(f"{model.name}: deployed in {time.perf_counter() - t0:.0f} s")
    d = await drivers(model, s)
    points = [await measure_point(model, c, s, d) for c in concurrencies(model, s)]
    for actor in d.extra.pop("actors", []):
        ray.kill(actor)
    await asyncio.to_thread(undeploy)
    ceilings = sorted(p["ceiling_items_per_s"] for p in points)
    kind = (f"offline encode(batch_size=64), one thread pinned to core {model.pin_core}"
            if model.name == "minilm" else "full batches of 64, in-process")
    return {"ceiling_items_per_s": ceilings[len(ceilings) // 2], "ceiling_kind": kind,
            "urls": d.urls, "points": points, **d.extra}


async def drivers(model: BenchModel, s: Settings) -> Drivers:
    from ray import serve

    from benchmarks.serve_drivers import http_body, http_url

    handles = {system: serve.get_app_handle(name) for system, (name, _) in APPS.items()}
    await pin_raybatch_replica(handles["raybatch"], model)
    payloads = model.payloads(64)
    d = Drivers(submits=_handle_submits(model, handles), fetch=_fetchers(model, handles),
                urls={system: await http_url(name, prefix, model.name, s.port,
                                             s.ingress == "direct")
                      for system, (name, prefix) in APPS.items()},
                payloads=payloads, bodies=[http_body(x, s.binary_http) for x in payloads],
                extra={})
    if s.probes:
        from benchmarks.serve_probes import add_probes

        d.extra = await add_probes(model, s.port + 5, handles, d.submits, d.urls, d.fetch)
        for hop, v in d.extra.get("hops", {}).items():
            _progress(f"  hop {hop:<50} p50 {v['p50_ms']:7.2f} ms  caller CPU "
                      f"{v['caller_cpu_us']:6.0f} us")
    return d


async def measure_point(model: BenchModel, c: int, s: Settings, d: Drivers) -> dict[str, Any]:
    """Every system at concurrency `c`, beside the model's ceiling measured just before
    (other people's load on the machine drifts within minutes)."""
    from benchmarks.serve_drivers import HttpDriver, isolate_core

    if s.isolate and model.pin_core is not None:  # at every point: Ray may start processes
        isolate_core(model.pin_core)
    top = ceiling(model, s.ceiling_s)
    _progress(f"{model.name} C={c}: ceiling {top:,.0f} items/s")
    point: dict[str, Any] = {"concurrency": c, "ceiling_items_per_s": top,
                             "loadavg_1m": os.getloadavg()[0]}
    if "handle" in s.paths:
        point["handle"] = {}
        for system, submit in d.submits.items():
            f = d.fetch["raybatch" if system.startswith("raybatch") else system]
            r = point["handle"][system] = await measure(submit, d.payloads, f, c, s)
            _progress_point(model.name, "handle", c, system, r, top)
    if "http" in s.paths:
        point["http"] = {}
        for system, url in d.urls.items():
            async with HttpDriver(url, c) as driver:
                r = await measure(driver.submit, d.bodies, d.fetch[system], c, s)
            point["http"][system] = r
            _progress_point(model.name, "http", c, system, r, top)
    return point


def _progress_point(model: str, path: str, c: int, system: str, r: dict[str, Any],
                    top: float) -> None:
    err = f" errors {r['errors']} ({r['first_error']})" if r["errors"] else ""
    _progress(f"{model:<7}{path:<7}C={c:<4}{system:<16}{r['throughput_rps']:>8,.0f} req/s "
              f"({r['throughput_rps'] / top:4.0%} of ceiling) p50 {r['p50_ms']:7.2f} ms "
              f"batch {r['mean_batch_size'] or 0:5.1f}{err}")


_T0 = time.perf_counter()


def _progress(line: str) -> None:
    print(f"[{time.perf_counter() - _T0:5.0f} s] {line}", file=sys.stderr, flush=True)


async def main_async(s: Settings, models: list[str]) -> dict[str, Any]:
    import ray
    from ray import serve

    t0 = time.perf_counter()
    results: dict[str, Any] = {
        "settings": asdict(s), "variant": s.ingress,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "ray": ray.__version__, "loadavg_start": os.getloadavg()},
        "env": {k: v for k, v in os.environ.items() if k.startswith("RAY_SERVE_")},
        "models": {},
    }
    ray.init(address="local", include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": s.port})
        catalog = bench_models()
        for name in models:
            results["models"][name] = await measure_model(catalog[name], s)
    finally:
        # Handles' long-poll clients live on this loop: silence them while Serve goes away.
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: None)
        await serve.shutdown_async()
        ray.shutdown()
    results["machine"]["loadavg_end"] = os.getloadavg()
    results["targets"] = targets(results)
    results["wall_s"] = time.perf_counter() - t0
    return results


def run_variants(args: argparse.Namespace) -> dict[str, Any]:
    """Each ingress variant in a process of its own, so each gets a fresh Ray and Serve."""
    out: dict[str, Any] = {"variants": {}}
    for v in args.ingress:
        with tempfile.NamedTemporaryFile(suffix=".json") as f:
            cmd = [sys.executable, "-m", "benchmarks.serve_compare", "--ingress", v,
                   "--json", f.name, "--port", str(args.port), "--models", *args.models,
                   "--paths", *args.paths]
            cmd += ["--concurrency", *map(str, args.concurrency)] if args.concurrency else []
            cmd += ["--duration", str(args.duration)] if args.duration else []
            cmd += [flag for flag, on in (("--quick", args.quick), ("--probes", args.probes),
                                          ("--json-http", args.json_http),
                                          ("--isolate-model-core", args.isolate_model_core))
                    if on]
            subprocess.run(cmd, check=True)
            with open(f.name) as g:
                out["variants"][v] = json.load(g)
    return out


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", choices=("sleep", "mlp", "minilm"),
                    default=["sleep", "mlp", "minilm"])
    ap.add_argument("--concurrency", nargs="+", type=int, metavar="C",
                    help="concurrencies (default 1 16 128 512, and 64 for minilm)")
    ap.add_argument("--duration", type=float, metavar="S", help="measured seconds per point")
    ap.add_argument("--quick", action="store_true", help="short windows, C = 1 and 128 (+64)")
    ap.add_argument("--json", metavar="OUT", help="also write the results as JSON here")
    ap.add_argument("--port", type=int, default=8100, help="Serve's HTTP port")
    ap.add_argument("--paths", nargs="+", choices=("handle", "http"), default=["handle", "http"])
    ap.add_argument("--ingress", nargs="+", choices=VARIANTS, default=["direct"],
                    help="HTTP front: direct ingress (default with THROUGHPUT_OPTIMIZED), "
                         "Serve's proxy, or HAProxy; several run one after another")
    ap.add_argument("--probes", action="store_true",
                    help="also measure the probes of benchmarks.serve_probes (not product "
                         "paths): straight to the batching actor, an aiohttp front, hop latencies")
    ap.add_argument("--isolate-model-core", action="store_true",
                    help="minilm: keep every other process (client, Ray, Serve) off the model's "
                         "core, not just pin the model replicas to it")
    ap.add_argument("--json-http", action="store_true",
                    help="JSON tensors over HTTP instead of the binary extension")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if len(args.ingress) > 1:
        merged = run_variants(args)
        if args.json:
            with open(args.json, "w") as f:
                json.dump(merged, f, indent=2)
        return
    s = replace(QUICK if args.quick else FULL, port=args.port, ingress=args.ingress[0],
                paths=tuple(args.paths), binary_http=not args.json_http, probes=args.probes,
                isolate=args.isolate_model_core)
    if args.concurrency:
        s = replace(s, concurrencies=tuple(args.concurrency))
    if args.duration:
        s = replace(s, duration_s=args.duration)
    configure_environment(s)
    results = asyncio.run(main_async(s, args.models))
    print(render(results))
    print(f"\nvariant {s.ingress}; wall {results['wall_s']:.0f} s; load average "
          f"{results['machine']['loadavg_start']} -> {results['machine']['loadavg_end']} "
          f"on {results['machine']['cpus']} CPUs")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
