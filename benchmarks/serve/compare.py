"""Raybatch against Ray Serve without batching and with `@serve.batch`, in one local Ray.

    python -m benchmarks.serve.compare [--models sleep mlp minilm] [--concurrency 1 16 128 512]
        [--duration S] [--quick] [--json OUT] [--port 8100] [--paths handle http]
        [--ingress direct proxy haproxy] [--setups default gpu actor]
        [--custom PLACEMENT+OPTION...] [--peers serve serve.batch serve.batch.stdjson]
        [--http-driver wrk|aiohttp] [--no-disconnect-watch] [--probes]
        [--isolate-model-core] [--json-http]

Per model, one-replica apps run side by side on one Serve HTTP port: `serve` (no
batching), `serve.batch` (`@serve.batch`, same max batch size and delay) and one
Raybatch app per setup (`rb:<setup>`): the named setups `default` (the product
default), `gpu` (the GPU setup) and `actor` (the batching-actor setup), and any one-off
`--custom` spec, option by option (`benchmarks.serve.settings` documents both); see
`benchmarks.serve.apps` for what is kept equal. Each is driven closed-loop at every C
through its handle (and Raybatch also through `RaybatchClient`, `rb:<setup>/client`)
and over HTTP (binary OIP tensors both ways, the same codec on all; `wrk` by default,
whose own CPU is small). Reported
per point: throughput, p50/p99, mean batch size, CPU per request of the client, of
the system's own processes (its ingress or Serve replica, batching actors, model
replicas), of the HTTP front (Serve proxy or HAProxy), of the controller, and of the
rest of Ray, each read from /proc; the 1-minute load.

Serve's fastest documented configuration is used: `RAY_SERVE_THROUGHPUT_OPTIMIZED=1`
is put in the environment before `ray` is imported (Serve reads it at import, in
this process and, inherited, in every Ray worker). It turns on direct ingress, so
`--ingress direct` (the default) sends HTTP straight to each app's ingress replica
port; `proxy` turns direct ingress off and goes through Serve's proxy; `haproxy`
sets `RAY_SERVE_ENABLE_HA_PROXY=1` and goes through HAProxy. With more than one,
each front runs in a fresh Ray in its own process.

minilm's model replica is pinned to one core in all three systems, and so is the
offline encode it is compared with: every thread of the replica's process, which
for the Serve baselines is also where HTTP and batching run (their architecture)
and for Raybatch is the model replica alone. Everything else floats over all
cores, unless `--isolate-model-core` keeps it off that core. Each model's ceiling
is measured again just before each concurrency point, with the apps idle.

Full run: about 8 minutes for one setup on 2 cores (490 s measured); `--quick`
(C = 1 and the targets' points, 1 s windows) about 2 minutes, noisier. `--probes`
adds the rows of `benchmarks.serve.probes` (not product paths) and a hop-latency
table; `--ingress direct proxy haproxy` runs each front in turn (~8 min each).
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

from benchmarks.common.results import save_json
from benchmarks.serve.measure import fetchers, handle_submits, measure, measure_wrk
from benchmarks.serve.models import BenchModel, bench_models, ceiling, raybatch_config
from benchmarks.serve.report import MINILM_C, SLEEP_C, render, targets
from benchmarks.serve.settings import (
    FRONTS,
    FULL,
    PEER_APPS,
    PEERS,
    QUICK,
    SETUPS,
    Settings,
    apps,
    configure_environment,
    native_port,
    spec_of,
)

# Re-exported: the other serve benchmarks deploy their apps as this one does.
__all__ = ["FULL", "QUICK", "Settings", "apps", "configure_environment", "deploy", "main",
           "native_port", "undeploy"]

CONCURRENCIES = (1, 16, 128, 512)


def concurrencies(model: BenchModel, s: Settings) -> list[int]:
    """The points of `model`: minilm also gets its target's C=64 (in place of 128 when quick)."""
    cs = list(s.concurrencies or CONCURRENCIES)
    if model.name == "minilm" and SLEEP_C in cs:
        cs.append(MINILM_C)
        if s.quick:
            cs.remove(SLEEP_C)
    return sorted(set(cs))


# -- deploying ----------------------------------------------------------------------------------
def deploy(model: BenchModel, s: Settings) -> None:
    """The apps of `model`, side by side (blocking: run it in a thread)."""
    from ray import serve

    from benchmarks.serve import apps as serve_apps
    from cluster.config import load_config
    from deployments.app import build_app

    targets = []
    for system, (name, prefix) in apps(s).items():
        if system.startswith("rb:"):
            cfg = raybatch_config(model, name, prefix, spec_of(system.removeprefix("rb:")),
                                  native_port(s, system))
            app = build_app(load_config(cfg))
        else:
            app = serve_apps.serve_app(getattr(serve_apps, PEER_APPS[system]), model)
        targets.append(serve.RunTarget(app, name=name, route_prefix=prefix))
    serve.run_many(targets)


def undeploy(s: Settings, timeout_s: float = 120.0) -> None:
    from ray import serve

    names = {name for name, _ in apps(s).values()}
    for name in names:
        serve.delete(name, _blocking=False)
    give_up = time.monotonic() + timeout_s
    while set(serve.status().applications) & names:
        if time.monotonic() > give_up:
            raise TimeoutError(f"apps {sorted(serve.status().applications)} still deleting")
        time.sleep(0.2)


async def pin_raybatch_replica(handle: Any, model: BenchModel) -> None:
    """Pin every thread of the Raybatch model replica's process to the model's core."""
    from benchmarks.serve.models import pin_process

    if model.pin_core is None:
        return
    for replica in (await handle.status.remote())[model.name]["replica_info"]:
        pin_process(replica["pid"], model.pin_core)


# -- measuring ----------------------------------------------------------------------------------
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
    await asyncio.to_thread(deploy, model, s)
    _progress(f"{model.name}: deployed in {time.perf_counter() - t0:.0f} s")
    d = await drivers(model, s)
    points = [await measure_point(model, c, s, d) for c in concurrencies(model, s)]
    for actor in d.extra.pop("actors", []):
        ray.kill(actor)
    await asyncio.to_thread(undeploy, s)
    ceilings = sorted(p["ceiling_items_per_s"] for p in points)
    kind = (f"offline encode(batch_size=64), one thread pinned to core {model.pin_core}"
            if model.name == "minilm" else "full batches of 64, in-process")
    return {"ceiling_items_per_s": ceilings[len(ceilings) // 2], "ceiling_kind": kind,
            "urls": d.urls, "points": points, **d.extra}


async def drivers(model: BenchModel, s: Settings) -> Drivers:
    from ray import serve

    from benchmarks.serve.drivers import http_body, http_url

    handles = {system: serve.get_app_handle(name) for system, (name, _) in apps(s).items()}
    for system, h in handles.items():
        if system.startswith("rb:"):
            await pin_raybatch_replica(h, model)
    payloads = model.payloads(64)
    d = Drivers(submits=handle_submits(model, handles), fetch=fetchers(model, handles),
                urls={system: await http_url(name, prefix, model.name, s.port,
                                             s.ingress == "direct", native_port(s, system))
                      for system, (name, prefix) in apps(s).items()},
                payloads=payloads, bodies=[http_body(x, s.binary_http) for x in payloads],
                extra={})
    if s.probes and "rb:actor" in handles and "serve" in handles:  # the batching-actor setup
        from benchmarks.serve.probes import add_probes

        # The probes reach the actor placement's batching actor (one per model name).
        handles["raybatch"], d.fetch["raybatch"] = handles["rb:actor"], d.fetch["rb:actor"]
        d.extra = await add_probes(model, s.port + 5, handles, d.submits, d.urls, d.fetch)
        del d.fetch["raybatch"]
        for hop, v in d.extra.get("hops", {}).items():
            _progress(f"  hop {hop:<50} p50 {v['p50_ms']:7.2f} ms  caller CPU "
                      f"{v['caller_cpu_us']:6.0f} us")
    return d


async def measure_point(model: BenchModel, c: int, s: Settings, d: Drivers) -> dict[str, Any]:
    """Every system at concurrency `c`, beside the model's ceiling measured just before
    (other people's load on the machine drifts within minutes)."""
    from benchmarks.serve.drivers import HttpDriver, isolate_core

    if s.isolate and model.pin_core is not None:  # at every point: Ray may start processes
        isolate_core(model.pin_core)
    top = ceiling(model, s.ceiling_s)
    _progress(f"{model.name} C={c}: ceiling {top:,.0f} items/s")
    point: dict[str, Any] = {"concurrency": c, "ceiling_items_per_s": top,
                             "loadavg_1m": os.getloadavg()[0]}
    names = apps(s)
    if "handle" in s.paths:
        point["handle"] = {}
        for system, submit in d.submits.items():
            base = system.split("/")[0]
            app = names.get(base, ("probe", ""))[0]
            f = d.fetch.get(base) or d.fetch[system]
            r = point["handle"][system] = await measure(submit, d.payloads, f, c, s, app,
                                                        base.startswith("rb:"))
            _progress_point(model.name, "handle", c, system, r, top)
    if "http" in s.paths:
        point["http"] = {}
        for system, url in d.urls.items():
            app = names.get(system, ("probe", ""))[0]
            rb = system.startswith("rb:")
            if s.http_driver == "wrk":
                r = await measure_wrk(url, d.bodies[0], d.fetch[system], c, s, app, rb)
            else:
                async with HttpDriver(url, c) as driver:
                    r = await measure(driver.submit, d.bodies, d.fetch[system], c, s, app, rb)
            point["http"][system] = r
            _progress_point(model.name, "http", c, system, r, top)
    return point


def _progress_point(model: str, path: str, c: int, system: str, r: dict[str, Any],
                    top: float) -> None:
    err = f" errors {r['errors']} ({r['first_error']})" if r["errors"] else ""
    own = r.get("own_and_front_cpu_us_per_req")
    _progress(f"{model:<7}{path:<7}C={c:<4}{system:<20}{r['throughput_rps']:>8,.0f} req/s "
              f"({r['throughput_rps'] / top:4.0%} of ceiling) p50 {r['p50_ms']:7.2f} ms "
              f"batch {r['mean_batch_size'] or 0:5.1f} server {own or 0:5.0f} us/req{err}")


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
    # Logical CPUs only (scheduling, not cores): room for every app of every variant at once.
    ray.init(address="local", num_cpus=16, include_dashboard=False, log_to_driver=False)
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
            cmd = [sys.executable, "-m", "benchmarks.serve.compare", "--ingress", v,
                   "--json", f.name, "--port", str(args.port), "--models", *args.models,
                   "--paths", *args.paths]
            cmd += ["--concurrency", *map(str, args.concurrency)] if args.concurrency else []
            cmd += ["--duration", str(args.duration)] if args.duration else []
            cmd += ["--setups", *args.setups, "--peers", *args.peers,
                    "--http-driver", args.http_driver]
            cmd += ["--custom", *args.custom] if args.custom else []
            cmd += [flag for flag, on in (("--quick", args.quick), ("--probes", args.probes),
                                          ("--json-http", args.json_http),
                                          ("--no-disconnect-watch", args.no_disconnect_watch),
                                          ("--no-throughput-optimized",
                                           args.no_throughput_optimized),
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
    ap.add_argument("--ingress", nargs="+", choices=FRONTS, default=["direct"],
                    help="HTTP front: direct ingress (default with THROUGHPUT_OPTIMIZED), "
                         "Serve's proxy, or HAProxy; several run one after another")
    ap.add_argument("--probes", action="store_true",
                    help="also measure the probes of benchmarks.serve.probes (not product "
                         "paths): straight to the batching actor, an aiohttp front, hop latencies")
    ap.add_argument("--isolate-model-core", action="store_true",
                    help="minilm: keep every other process (client, Ray, Serve) off the model's "
                         "core, not just pin the model replicas to it")
    ap.add_argument("--json-http", action="store_true",
                    help="JSON tensors over HTTP instead of the binary extension")
    ap.add_argument("--setups", nargs="*", choices=tuple(SETUPS), default=None,
                    help="Raybatch's named setups (default: default): "
                         + "; ".join(f"{k}: {v[1]}" for k, v in SETUPS.items()))
    ap.add_argument("--custom", nargs="+", default=[], metavar="PLACEMENT[+OPTION...]",
                    help="one-off Raybatch apps beside the setups: actor|ingress, then options "
                         "(benchmarks.serve.settings.OPTIONS): idle, inproc, native, fill, "
                         "leadN, ahead, pipe1, access, raycall; e.g. ingress+idle+inproc+fill")
    ap.add_argument("--peers", nargs="*", choices=tuple(PEERS), default=["serve", "serve.batch"],
                    help="Serve baselines to run beside Raybatch")
    ap.add_argument("--http-driver", choices=("wrk", "aiohttp"), default="wrk",
                    help="HTTP load generator (wrk: little client CPU; aiohttp: many payloads)")
    ap.add_argument("--no-disconnect-watch", action="store_true",
                    help="HTTP clients send x-request-disconnect-disabled: ?1 (Serve then "
                         "skips its per-request disconnect watch)")
    ap.add_argument("--no-throughput-optimized", action="store_true",
                    help="RAY_SERVE_THROUGHPUT_OPTIMIZED=0 (direct ingress stays as --ingress "
                         "says): what the switch buys")
    return ap.parse_args(argv)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if args.setups is None:
        args.setups = [] if args.custom else ["default"]
    for spec in args.custom:
        try:
            spec_of(spec)
        except ValueError as e:
            raise SystemExit(f"--custom: {e}") from None
    if len(args.ingress) > 1:
        merged = run_variants(args)
        save_json(args.json, merged)
        return
    s = replace(QUICK if args.quick else FULL, port=args.port, ingress=args.ingress[0],
                paths=tuple(args.paths), binary_http=not args.json_http, probes=args.probes,
                isolate=args.isolate_model_core,
                setups=tuple(dict.fromkeys([*args.setups, *args.custom])),
                peers=tuple(args.peers), http_driver=args.http_driver,
                disconnect_watch=not args.no_disconnect_watch,
                throughput_optimized=not args.no_throughput_optimized)
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
    save_json(args.json, results)


if __name__ == "__main__":
    main()
