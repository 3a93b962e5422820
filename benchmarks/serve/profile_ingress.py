"""Where the ingress replica's CPU goes per HTTP (or handle) request, on the product path.

    python -m benchmarks.serve.profile_ingress [--models mlp sleep] [--concurrency 128]
        [--duration 3] [--json-http] [--out DIR] [--setup default|gpu|actor|CUSTOM]
        [--path http|handle|client]

Per model: one Raybatch app (a setup of `benchmarks.serve.settings`, the product default
unless `--setup` names another or a custom spec such as `ingress+idle+inproc`; deployed
as `benchmarks.serve.compare` deploys it) driven by `wrk` at C connections. Two windows:
the first measures the ingress replica's CPU per request from /proc, split into user
(Python, the parser) and system (the kernel: sockets, epoll, wake-ups), and the model
replicas' too; the second runs `py-spy record --nonblocking --gil` on the ingress
replica meanwhile and writes its samples (`--format raw`) and a summary of them: each
function's self and inclusive share, and the shares of the cost groups (uvicorn,
Raybatch's HTTP front, the codec, route, engine, Ray) that the figures are argued from.
`--path handle` drives the app's DeploymentHandle instead (`handle.infer.remote`, C
callers in a closed loop, from this process); `--path client` drives it through
`RaybatchClient` (C callers of `client.infer`), and profiles the process that runs the
engine (the batching actor with an `actor` placement, else the ingress) and this process
(the client) side by side.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import os
import subprocess
import sys
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from benchmarks.serve.compare import deploy, undeploy
from benchmarks.serve.settings import (
    FULL,
    apps,
    configure_environment,
    native_port,
    spec_of,
)

CLOCK = os.sysconf("SC_CLK_TCK")
# Cost groups, by the first match of a frame's file (a frame is "function (file:line)").
GROUPS = (
    ("uvicorn/httptools", ("uvicorn/", "httptools", "h11")),
    ("starlette/serve wrapper", ("starlette/", "ray/serve/")),
    ("raybatch http server", ("deployments/http/pyserver/server.py",)),
    ("raybatch http front", ("deployments/http/",)),
    ("raybatch codec", ("deployments/protocol/",)),
    ("raybatch route/signature/backend", ("deployments/ingress/route.py",
                                          "deployments/signature.py",
                                          "deployments/ingress/placement.py",
                                          "deployments/ingress/deployment.py")),
    ("raybatch engine", ("batching/",)),
    ("raybatch client/coalescer/bundles", ("deployments/ingress/client.py",
                                           "deployments/ingress/coalesce.py",
                                           "deployments/wire/bundles.py")),
    ("raybatch batching actor/hosts", ("deployments/batcher/",)),
    ("the load's own callers", ("benchmarks/",)),
    ("raybatch pool", ("deployments/replica/pool.py",)),
    ("ray core", ("ray/",)),
    ("asyncio", ("asyncio/",)),
    ("numpy", ("numpy/",)),
)


def _stat(path: str) -> tuple[str, float, float]:
    """(name, user s, system s) of a process or thread from its /proc stat file."""
    with open(path) as f:
        head, rest = f.read().rsplit(")", 1)
    fields = rest.split()
    return head.split("(", 1)[1], int(fields[11]) / CLOCK, int(fields[12]) / CLOCK


def user_sys_s(pid: int) -> tuple[float, float]:
    return _stat(f"/proc/{pid}/stat")[1:]


def threads_s(pid: int) -> collections.Counter:
    """User + system CPU seconds of each of the process's threads, by name and thread id
    (what the process's own loop spends against Ray's and the libraries' threads; threads
    inherit their creator's name, so the id tells them apart)."""
    out: collections.Counter = collections.Counter()
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            name, user_s, sys_s = _stat(f"/proc/{pid}/task/{tid}/stat")
        except OSError:  # the thread ended meanwhile
            continue
        out[f"{'main' if tid == str(pid) else name} [{tid}]"] += user_s + sys_s
    return out


def pids_titled(prefix: str) -> list[int]:
    from benchmarks.serve.drivers import _title, descendants

    return [p for p in descendants(os.getpid()) if _title(p).startswith(prefix)]


def summarise(raw: Path, top: int = 30) -> str:
    """Self and inclusive shares per function, and per cost group (by self time)."""
    self_c: collections.Counter = collections.Counter()
    incl: collections.Counter = collections.Counter()
    groups: collections.Counter = collections.Counter()
    total = 0
    for line in raw.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack:
            continue
        count = int(n)
        total += count
        frames = stack.split(";")
        self_c[frames[-1]] += count
        for f in set(frames):
            incl[f] += count
        groups[group_of(frames)] += count
    out = [f"total samples {total}", "== cost groups (self time of the innermost "
           "Python frame; C calls count where they are called)"]
    out += [f"{100 * n / total:5.1f}% {g}" for g, n in groups.most_common()]
    out += ["== self"] + [f"{100 * n / total:5.1f}% {f}" for f, n in self_c.most_common(top)]
    out += ["== inclusive"] + [f"{100 * n / total:5.1f}% {f}"
                               for f, n in incl.most_common(top)]
    return "\n".join(out)


def group_of(frames: list[str]) -> str:
    leaf = frames[-1]
    for name, marks in GROUPS:
        if any(m in leaf for m in marks):
            return name
    if "threading.py" in "".join(frames[:3]):
        return "other threads (Ray's)"
    return "other"


@dataclass
class Load:
    """What one window of load did: requests answered, their rate, errors, client CPU."""

    requests: int
    throughput_rps: float
    errors: int
    client_cpu_us_per_req: float


async def drive(call: Any, c: int, duration_s: float) -> Load:
    """C callers of `await call()` in a closed loop for `duration_s` (a handle's
    `infer.remote(name, ...)`, or a `RaybatchClient`'s `infer(name, ...)`)."""
    stop = time.monotonic() + duration_s
    done = [0, 0]

    async def caller() -> None:
        while time.monotonic() < stop:
            try:
                await call()
                done[0] += 1
            except Exception:  # counted, not raised: the window goes on
                done[1] += 1

    cpu0, t0 = time.process_time(), time.monotonic()
    await asyncio.gather(*(caller() for _ in range(c)))
    wall, cpu = time.monotonic() - t0, time.process_time() - cpu0
    return Load(done[0], done[0] / wall, done[1], cpu / max(done[0], 1) * 1e6)


def spy(pid: int, seconds: float, raw: Path) -> subprocess.Popen:
    return subprocess.Popen([str(Path(sys.executable).parent / "py-spy"), "record", "--pid",
                             str(pid), "--duration", str(int(seconds)), "--rate", "200",
                             "--format", "raw", "--nonblocking", "--gil", "-o", str(raw)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


async def profile_model(name: str, c: int, duration_s: float, binary: bool,
                        out: Path, variant: str = "default",
                        path: str = "http", process: str = "engine") -> dict[str, Any]:
    from ray import serve

    from benchmarks.common.wrk import run_wrk
    from benchmarks.serve.drivers import http_body, http_url
    from benchmarks.serve.models import bench_models

    s = replace(FULL, setups=(variant,), peers=(), binary_http=binary)
    model = bench_models()[name]
    await asyncio.to_thread(deploy, model, s)
    app, prefix = apps(s)[f"rb:{variant}"]
    if path == "handle":
        handle, x = serve.get_app_handle(app), model.payloads(1)[0]

        async def load(seconds: float) -> Any:
            return await drive(lambda: handle.infer.remote(model.name, {"INPUT0": x}), c,
                               seconds)
    elif path == "client":
        from deployments.ingress.client import RaybatchClient

        client, x = RaybatchClient(serve.get_app_handle(app)), model.payloads(1)[0]

        async def load(seconds: float) -> Any:
            return await drive(lambda: client.infer(model.name, {"INPUT0": x}), c, seconds)
    else:
        url = await http_url(app, prefix, model.name, s.port, True,
                             native_port(s, f"rb:{variant}"))
        data, headers = http_body(model.payloads(1)[0], binary)

        async def load(seconds: float) -> Any:
            return await asyncio.to_thread(run_wrk, url, data, headers, connections=c,
                                           duration_s=seconds)
    [ingress] = pids_titled(f"ray::ServeReplica:{app}:Ingress")
    if spec_of(variant).startswith("actor") and (path == "client" or process == "batcher"):
        [ingress] = pids_titled("ray::BatcherActor")  # where the engine runs
    replicas = pids_titled("ray::ModelReplica")
    await load(1)
    u0, s0 = user_sys_s(ingress)
    t0 = threads_s(ingress)
    m0 = sum(sum(user_sys_s(p)) for p in replicas)
    r = await load(duration_s)
    u1, s1 = user_sys_s(ingress)
    threads = threads_s(ingress)
    threads.subtract(t0)
    m1 = sum(sum(user_sys_s(p)) for p in replicas)
    n = r.requests
    body = path if path in ("handle", "client") else "binary" if binary else "json"
    suffix = "" if variant == "default" else "_" + variant.replace("+", "-")
    tag = f"{name}_{body}_c{c}{suffix}"
    raw = out / f"pyspy_ingress_{tag}.raw"
    spies = [spy(ingress, duration_s, raw)]
    own_raw = out / f"pyspy_client_{tag}.raw"
    if path == "client":  # the caller's own process is half of this path
        spies.append(spy(os.getpid(), duration_s, own_raw))
    spied = await load(duration_s)
    for p in spies:
        p.wait(timeout=60)
    await asyncio.to_thread(undeploy, s)
    result = {"model": name, "concurrency": c, "binary": binary, "variant": variant,
              "path": path,
              "throughput_rps": r.throughput_rps, "errors": r.errors,
              "ingress_user_us_per_req": (u1 - u0) / n * 1e6,
              "ingress_sys_us_per_req": (s1 - s0) / n * 1e6,
              "model_replica_us_per_req": (m1 - m0) / n * 1e6,
              "ingress_threads_us_per_req": {k: round(v / n * 1e6, 1) for k, v in
                                             threads.most_common() if v > 0},
              "client_cpu_us_per_req": r.client_cpu_us_per_req,
              "spied_throughput_rps": spied.throughput_rps,
              "loadavg_1m": os.getloadavg()[0]}
    head = (f"{tag}: {r.throughput_rps:,.0f} req/s ({spied.throughput_rps:,.0f} while "
            f"profiled); ingress CPU {result['ingress_user_us_per_req']:.0f} us user + "
            f"{result['ingress_sys_us_per_req']:.0f} us system per request; model replicas "
            f"{result['model_replica_us_per_req']:.0f} us; wrk {r.client_cpu_us_per_req:.0f} "
            f"us; load {result['loadavg_1m']:.2f}")
    head += "\nby thread (us per request): " + ", ".join(
        f"{k} {v}" for k, v in list(result["ingress_threads_us_per_req"].items())[:8])
    text = head + "\n" + (summarise(raw) if raw.exists() else "(py-spy wrote nothing)")
    if own_raw.exists():
        text += "\n\n== the client's process (RaybatchClient callers)\n" + summarise(own_raw)
    (out / f"pyspy_ingress_{tag}.txt").write_text(text + "\n")
    print(text, flush=True)
    return result


async def main_async(args: argparse.Namespace) -> None:
    import ray
    from ray import serve

    ray.init(address="local", num_cpus=16, include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": FULL.port})
        for name in args.models:
            await profile_model(name, args.concurrency, args.duration, not args.json_http,
                                _made(Path(args.out)), args.variant, args.path, args.process)
    finally:
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: None)
        await serve.shutdown_async()
        ray.shutdown()


def _made(path: Path) -> Path:
    path.mkdir(parents=True, exist_ok=True)
    return path


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--models", nargs="+", choices=("sleep", "mlp"), default=["mlp"])
    ap.add_argument("--concurrency", type=int, default=128)
    ap.add_argument("--duration", type=float, default=3.0)
    ap.add_argument("--json-http", action="store_true")
    ap.add_argument("--out", default=".", help="where the samples and summaries go")
    ap.add_argument("--setup", default="default", dest="variant",
                    help="a named setup (default, gpu, actor) or a custom spec "
                         "(PLACEMENT+OPTION..., see benchmarks.serve.settings)")
    ap.add_argument("--path", default="http", choices=("http", "handle", "client"))
    ap.add_argument("--process", default="engine", choices=("engine", "batcher"),
                    help="with an actor variant over HTTP: profile the batching actor "
                         "instead of the ingress")
    args = ap.parse_args()
    try:
        spec_of(args.variant)
    except ValueError as e:
        ap.error(str(e))
    configure_environment(replace(FULL, setups=(args.variant,), peers=()))
    t0 = time.perf_counter()
    asyncio.run(main_async(args))
    print(f"wall {time.perf_counter() - t0:.0f} s", file=sys.stderr)


if __name__ == "__main__":
    main()
