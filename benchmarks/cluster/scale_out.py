"""Scale-out on a lab of hosts: a CPU-bound model's throughput on 1, 2 and 3 worker hosts.

    flock /tmp/raybatch-ray.lock .venv/bin/python -m benchmarks.cluster.scale_out

(root: the lab makes network namespaces and cgroups; about 4 minutes.)

What: a lab (benchmarks.cluster.lab) of `--hosts` worker hosts at `--cpus` CPU each and a
head (198.18.0.1, no quota: the rest of the machine). Ray's head, the ingress and the
model's batching actor run on the head (both ask for `labhead`, which only the head
advertises); each replica asks for `labhost: 1`, which each worker host advertises once, so
k replicas take k hosts. The model is `MatChain` (benchmarks.common.models): deterministic
GEMM chains whose cost per item is measured first, on one core and on a lab host alone.

How: for k = 1..hosts, `raybatch up --address <head> --exit-after-deploy` deploys the app
with min = max = k replicas (a redeploy of one app); `raybatch status --json` says where
each part runs; 32 distinct requests (sent at once, so batches mix) are checked against the
model run here; `wrk` (one thread, keep-alive, one OIP binary request of one item) warms
up, then drives `--per-host-connections` x k connections for `--duration` s on Raybatch's
own HTTP port on the head; the answers are checked again. Over the timed window: each
host's and the head's CPU from their cgroups, the head's and hosts' processes by role from
/proc, and wrk's own CPU. The figure of merit is items/s at k = hosts over k = 1 (target
>= 2.6 at 3 hosts); README.md, result.json and scale-out.png go to `--results`.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import subprocess
import sys
import time
import urllib.request
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import yaml

from benchmarks.cluster.cgroups import require
from benchmarks.cluster.lab import HEAD_CGROUP, HEAD_IP, Lab
from benchmarks.common.models import MatChain, matchain_payloads
from benchmarks.common.wrk import run_wrk
from benchmarks.peers.measure import check_answer
from benchmarks.peers.systems import decode_oip
from cluster.ports import free_port

REPO = Path(__file__).resolve().parents[2]
APP, MODEL = "scaleout", "matchain"
TARGET = 2.6  # items/s at 3 hosts over 1 host: the scale-out target
CHECKS = 32  # distinct requests checked before and after each timed run
ONE_THREAD = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

# The model alone on full batches back to back: CPU ms per item and items/s (one process).
_COST = """
import json, sys, time
from benchmarks.common.models import MatChain, matchain_payloads
dim, steps, batch, secs = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), float(sys.argv[4])
m = MatChain(dim=dim, steps=steps); m.setup("cpu"); items = matchain_payloads(batch, dim)
m(items)
n, c0, t0 = 0, time.process_time(), time.perf_counter()
while time.perf_counter() - t0 < secs:
    m(items); n += batch
c, t = time.process_time() - c0, time.perf_counter() - t0
print("COST " + json.dumps({"items": n, "cpu_ms_per_item": c / n * 1e3, "items_per_s": n / t}))
"""


def model_cost(lab: Lab, host: int | None, args: argparse.Namespace) -> dict[str, float]:
    """The model alone, in a process on `host` (None: outside the lab, on this machine)."""
    argv = [sys.executable, "-c", _COST, str(args.dim), str(args.steps), str(args.batch), "6"]
    env = {**os.environ, **ONE_THREAD, "PYTHONPATH": str(REPO)}
    if host is None:
        out = subprocess.run(argv, env=env, cwd=REPO, capture_output=True, text=True,
                             timeout=120).stdout
    else:
        out = lab.run(host, argv, env=env, stdout=subprocess.PIPE, text=True
                      ).communicate(timeout=120)[0]
    line = next(x for x in out.splitlines() if x.startswith("COST "))
    return json.loads(line[5:])


def app_config(k: int, args: argparse.Namespace) -> dict[str, Any]:
    tensor = {"datatype": "FP32", "shape": [-1, args.dim]}
    return {
        "app_name": APP, "python_path": [str(REPO)],
        "ingress": {"num_cpus": 0, "resources": {"labhead": 0.001}, "route_prefix": "/"},
        "models": [{
            "name": MODEL, "transformer": "benchmarks.common.models:MatChain",
            "init_kwargs": {"dim": args.dim, "steps": args.steps},
            "inputs": [{"name": "INPUT0", **tensor}], "outputs": [{"name": "OUTPUT0", **tensor}],
            "batching": {"max_batch_size": args.batch, "max_queue_delay_s": 0.002,
                         "idle_dispatch": True},
            # one replica per host: each host advertises labhost once (and 1 CPU)
            "replicas": {"min_replicas": k, "max_replicas": k, "num_cpus": 1, "pin": "off",
                         "resources": {"labhost": 1}, "env": ONE_THREAD},
            "batcher": {"placement": "actor", "num_cpus": 0,
                        "resources": {"labhead": 0.001}},
            # a full closed loop queues up to C items: no refusals for waiting
            "limits": {"max_queue_wait_s": 30.0},
        }],
    }


def infer_body(x: np.ndarray) -> tuple[bytes, dict[str, str]]:
    raw = np.ascontiguousarray(x, np.float32).tobytes()
    head = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": list(x.shape),
                                   "parameters": {"binary_data_size": len(raw)}}],
                       "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": True}}]}
                      ).encode()
    return head + raw, {"Content-Type": "application/octet-stream",
                        "Inference-Header-Content-Length": str(len(head))}


def check_answers(url: str, model: MatChain, payloads: list[np.ndarray]) -> None:
    """Each payload once, all at once (so batches mix); WrongAnswer unless each is right."""
    def one(x: np.ndarray) -> None:
        body, headers = infer_body(x[None])
        check_answer(url, body, headers, decode_oip, np.asarray(model([x]))[None])

    with concurrent.futures.ThreadPoolExecutor(len(payloads)) as pool:
        list(pool.map(one, payloads))


# -- where CPU went: cgroups and processes -------------------------------------------------------
ROLES = (("ServeReplica", "ingress (Serve replica)"), ("BatcherActor", "batching actor"),
         ("ServeController", "Serve controller"), ("haproxy", "HAProxy"),
         ("gcs_server", "Ray GCS"), ("raylet", "raylet"), ("Replica", "model replica"))


def role(pid: int) -> str:
    try:
        cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return "gone"
    for key, name in ROLES:
        if key in cmd:
            return name
    return "Ray's other processes" if "ray" in cmd.lower() else "other"


def proc_cpu(pids: set[int]) -> dict[int, tuple[str, float]]:
    out = {}
    for pid in pids:
        try:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        except (OSError, IndexError):
            continue
        out[pid] = (role(pid), (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK"))
    return out


def sample(lab: Lab) -> dict[str, Any]:
    cg = require()
    hosts = {h: lab.cpu_stat(h) for h in range(lab.hosts)}
    pids = {"head": lab.pids(None), **{f"host{h}": lab.pids(h) for h in range(lab.hosts)}}
    return {"t": time.monotonic(), "head": cg.stat(HEAD_CGROUP), "hosts": hosts,
            "procs": {where: proc_cpu(p) for where, p in pids.items()}}


def cpu_between(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """CPUs (cores) used over the window: head and each host, and by role in each."""
    wall = b["t"] - a["t"]
    cores = {"head": (b["head"]["usage_usec"] - a["head"]["usage_usec"]) / 1e6 / wall}
    throttled = {}
    for h in b["hosts"]:
        used_us = b["hosts"][h]["usage_usec"] - a["hosts"][h]["usage_usec"]
        cores[f"host{h}"] = used_us / 1e6 / wall
        periods = b["hosts"][h].get("nr_periods", 0) - a["hosts"][h].get("nr_periods", 0)
        held = b["hosts"][h].get("nr_throttled", 0) - a["hosts"][h].get("nr_throttled", 0)
        throttled[f"host{h}"] = held / periods if periods else 0.0  # share of CFS periods
    roles: dict[str, dict[str, float]] = {}
    for where, procs in b["procs"].items():
        mine = roles.setdefault(where, {})
        for pid, (name, cpu) in procs.items():
            before = a["procs"][where].get(pid, (name, 0.0))[1]
            mine[name] = mine.get(name, 0.0) + max(cpu - before, 0.0) / wall
    by_role = {w: dict(sorted(r.items(), key=lambda kv: -kv[1])) for w, r in roles.items()}
    return {"window_s": wall, "cores": cores, "throttled_share": throttled, "by_role": by_role}


# -- one k ---------------------------------------------------------------------------------------
def deploy(lab: Lab, head: str, k: int, ports: dict[str, int], env: dict[str, str],
           args: argparse.Namespace) -> dict[str, Any]:
    cfg = args.logs / f"config-k{k}.yaml"
    cfg.write_text(yaml.safe_dump(app_config(k, args), sort_keys=False))
    rb = str(Path(sys.executable).parent / "raybatch")
    up = lab.run(None, [rb, "up", "--address", head, "--config", str(cfg), "--host", "0.0.0.0",
                        "--port", str(ports["http"]), "--native-port", str(ports["native"]),
                        "--grpc-port", str(ports["grpc"]), "--exit-after-deploy"],
                 env=lab.ray_env(env), log=args.logs / "up.log", cwd=REPO)
    if up.wait(timeout=300) != 0:
        raise RuntimeError(f"raybatch up failed for k={k}: see {args.logs / 'up.log'}")
    give_up = time.monotonic() + 120
    while True:  # every replica of the new deployment running, on its host
        st = lab.run(None, [rb, "status", "--address", head, "--app", APP, "--json"],
                     env=lab.ray_env(env), cwd=REPO, stdout=subprocess.PIPE,
                     stderr=subprocess.DEVNULL, text=True)
        try:
            m = json.loads(st.communicate(timeout=90)[0])[MODEL]
        except (ValueError, KeyError):
            m = {}
        reps = m.get("replica_info", [])
        if len(reps) == k and all(r.get("state") == "ALIVE" for r in reps):
            break
        if time.monotonic() > give_up:
            raise RuntimeError(f"k={k}: replicas not all running after 120 s: {reps}")
        time.sleep(2)
    return {"replicas": sorted(r.get("node_ip") or "?" for r in reps),
            "batching_actors": [b.get("node_ip") for b in m.get("batching_actors", [])],
            "ingress": [i.get("node_ip") for i in m.get("ingress_replicas", [])]}


def stats(base: str) -> tuple[int, int] | None:
    """(batches, items) run so far, from the model's statistics route."""
    try:
        with urllib.request.urlopen(base + f"/v2/models/{MODEL}/stats", timeout=10) as r:
            s = json.loads(r.read())["model_stats"][0]
        return int(s["execution_count"]), int(s["inference_count"])
    except (OSError, KeyError, IndexError, ValueError):
        return None


def measure(lab: Lab, k: int, base: str, model: MatChain, args: argparse.Namespace
            ) -> dict[str, Any]:
    url = base + f"/v2/models/{MODEL}/infer"
    payloads = matchain_payloads(CHECKS, args.dim)
    check_answers(url, model, payloads)
    body, headers = infer_body(payloads[0][None])
    connections = args.per_host_connections * k
    run_wrk(url, body, headers, connections=connections, duration_s=args.warmup)
    s0, b0 = sample(lab), stats(base)
    r = run_wrk(url, body, headers, connections=connections, duration_s=args.duration)
    s1, b1 = sample(lab), stats(base)
    check_answers(url, model, payloads)
    batch = (b1[1] - b0[1]) / (b1[0] - b0[0]) if b0 and b1 and b1[0] > b0[0] else None
    return {"k": k, "connections": connections, "req_per_s": r.throughput_rps,
            "items_per_s": r.throughput_rps, "p50_ms": r.p50_ms, "p99_ms": r.p99_ms,
            "requests": r.requests, "errors": r.errors, "first_error": r.first_error,
            "mean_batch": batch, "wrk_cpu_cores": r.client_cpu_s / r.window_s,
            "cpu": cpu_between(s0, s1)}


# -- the run --------------------------------------------------------------------------------------
def machine() -> dict[str, Any]:
    from benchmarks.cluster.faults_report import machine as described

    return {**described(), "numpy": np.__version__}


def run(args: argparse.Namespace) -> dict[str, Any]:
    args.results.mkdir(parents=True, exist_ok=True)
    args.logs.mkdir(parents=True, exist_ok=True)
    model = MatChain(dim=args.dim, steps=args.steps)
    model.setup("cpu")
    out: dict[str, Any] = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"), "machine": machine(),
        "command": " ".join(["flock /tmp/raybatch-ray.lock .venv/bin/python -m "
                             "benchmarks.cluster.scale_out", *sys.argv[1:]]),
        "settings": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
        "target": TARGET, "config": app_config(args.hosts, args), "runs": []}
    t0 = time.monotonic()
    with Lab(hosts=args.hosts, cpus=args.cpus) as lab:
        out["cost_one_core"] = model_cost(lab, None, args)
        out["cost_on_host"] = model_cost(lab, 0, args)
        print(f"model alone: {out['cost_one_core']['cpu_ms_per_item']:.2f} CPU ms per item on "
              f"one core; {out['cost_on_host']['items_per_s']:.1f} items/s on one lab host",
              flush=True)
        ports = {k: free_port("0.0.0.0") for k in ("http", "native", "grpc", "stats", "metrics")}
        env = {"RAY_SERVE_HAPROXY_STATS_PORT": str(ports["stats"]),
               "RAY_SERVE_HAPROXY_METRICS_PORT": str(ports["metrics"])}
        head = lab.start_head(num_cpus=1, ray_args=["--resources", '{"labhead": 1}'], env=env,
                              log=args.logs / "head.log")
        for h in range(args.hosts):
            lab.join(h, head, num_cpus=1, resources={"labhost": 1},
                     log=args.logs / f"join-host{h}.log")
        nodes = lab.wait_nodes(head, args.hosts + 1, timeout_s=120)
        print(f"[{time.monotonic() - t0:.0f} s] {len(nodes)} Ray nodes", flush=True)
        out["nodes"] = {n["NodeManagerAddress"]: {k: v for k, v in n["Resources"].items()
                                                  if not k.startswith("node:")}
                        for n in nodes if n["Alive"]}
        base = f"http://{HEAD_IP}:{ports['native']}"
        for k in range(1, args.hosts + 1):
            where = deploy(lab, head, k, ports, env, args)
            r = {**measure(lab, k, base, model, args), "placement": where}
            out["runs"].append(r)
            c = r["cpu"]["cores"]
            print(f"[{time.monotonic() - t0:.0f} s] k={k}: {r['items_per_s']:.1f} items/s, "
                  f"p50 {r['p50_ms']:.0f} ms, p99 {r['p99_ms']:.0f} ms, errors {r['errors']}, "
                  f"batch {r['mean_batch']}, "
                  f"cores {json.dumps({n: round(v, 3) for n, v in c.items()})}, "
                  f"replicas on {where['replicas']}", flush=True)
    out["machine"]["load_end"] = os.getloadavg()
    first, last = out["runs"][0]["items_per_s"], out["runs"][-1]["items_per_s"]
    out["speedup"] = last / first if first else 0.0
    out["met"] = out["speedup"] >= TARGET
    return out


def plot(out: dict[str, Any], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ks = [r["k"] for r in out["runs"]]
    got = [r["items_per_s"] for r in out["runs"]]
    fig, ax = plt.subplots(figsize=(6, 4), dpi=110)
    ax.plot(ks, [k * got[0] for k in ks], "--", color="gray", label="ideal: k × one host")
    ax.plot(ks, [k * out["cost_on_host"]["items_per_s"] for k in ks], ":", color="gray",
            label="k × the model alone on a host")
    ax.plot(ks, got, "o-", color="tab:blue", label="Raybatch, measured")
    for k, v in zip(ks, got, strict=True):
        ax.annotate(f"{v:.0f}", (k, v), textcoords="offset points", xytext=(6, -12))
    s = out["settings"]
    ax.set(xlabel="worker hosts (one replica each)", ylabel="items/s", xticks=ks, ylim=(0, None),
           title=f"MatChain dim {s['dim']}, {s['steps']} steps; hosts at {s['cpus']} CPU: "
                 f"{out['speedup']:.2f}× at {ks[-1]}")
    ax.grid(alpha=0.3)
    ax.legend(loc="upper left", fontsize=8)
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)


def _row(r: dict[str, Any], s: dict[str, Any], alone: float) -> str:
    cores, k, on = r["cpu"]["cores"], r["k"], r["placement"]["replicas"]
    busy = [f"host{h}" for h in range(s["hosts"]) if f"198.18.0.{10 + h}" in on]
    idle = [f"host{h}" for h in range(s["hosts"]) if f"198.18.0.{10 + h}" not in on]
    held = min((r["cpu"]["throttled_share"][h] for h in busy), default=0.0)
    head = ", ".join(f"{name} {v:.2f}" for name, v in r["cpu"]["by_role"]["head"].items()
                     if v >= 0.005)
    batch = f"{r['mean_batch']:.1f}" if r["mean_batch"] else "?"
    return (f"| {k} | {r['connections']} | {r['items_per_s']:.1f} | "
            f"{r['items_per_s'] / (k * alone):.2f} | {r['p50_ms']:.0f} / {r['p99_ms']:.0f} | "
            f"{batch} | {' '.join(f'{cores[h]:.3f}' for h in busy)} ({held:.0%}) | "
            f"{sum(cores[h] for h in busy) / r['items_per_s'] * 1e3:.2f} | "
            f"{' '.join(f'{cores[h]:.3f}' for h in idle) or '-'} | {cores['head']:.2f} | "
            f"{head} | {r['wrk_cpu_cores']:.3f} | {r['errors']} |")


def readme(out: dict[str, Any]) -> str:
    m, s, c1, ch = out["machine"], out["settings"], out["cost_one_core"], out["cost_on_host"]
    load = [" / ".join(f"{x:.2f}" for x in m[w]) for w in ("load_start", "load_end")]
    verdict = "PASS" if out["met"] else "MISS"
    return "\n".join([
        f"# Scale-out on a lab of hosts: a CPU-bound model on 1 to {s['hosts']} worker hosts",
        "", f"Date: {out['date']}. Machine: {m['cpus']} CPUs ({m['cpu']}), kernel {m['kernel']}, "
        f"Python {m['python']}, Ray {m['ray']}, numpy {m['numpy']}, tree {m['git']}; load "
        f"average (1, 5, 15 min) {load[0]} at the start, {load[1]} at the end (the machine is "
        "shared: other sessions' work counts in it).", "", f"Command: `{out['command']}`", "",
        f"Lab: {s['hosts']} worker hosts (network namespaces at 198.18.0.10+), each a cgroup "
        f"quota of {s['cpus']} CPU and a Ray node with `labhost: 1`; the head (198.18.0.1, no "
        "quota) runs Ray's head, the ingress and the batching actor (`labhead`). Model: "
        f"`MatChain` dim {s['dim']}, {s['steps']} steps, one BLAS thread: "
        f"**{c1['cpu_ms_per_item']:.2f} CPU ms per item on one core** (batches of "
        f"{s['batch']} back to back); {ch['items_per_s']:.1f} items/s alone on one lab host "
        f"({s['cpus'] / ch['items_per_s'] * 1e3:.2f} ms of the host's CPU per item). Batching: "
        f"max batch {s['batch']}, 2 ms, idle dispatch; replicas unpinned, 2 batches in flight "
        f"each. Load: wrk, one thread, {s['per_host_connections']} connections per replica "
        f"host, one item per request (OIP binary), {s['warmup']} s warm-up then "
        f"{s['duration']} s timed, on Raybatch's own HTTP port; {CHECKS} distinct answers "
        "checked before and after each timed run. CPU in cores (1.0 = one core busy); the "
        "share of CFS periods in which the quota held a replica host back in brackets.", "",
        "| hosts | C | items/s (= req/s) | ÷ (k × model alone on a host) | p50 / p99 ms | "
        "mean batch | replica hosts' CPU | their CPU ms per item | idle hosts' CPU | head CPU "
        "| head by role | wrk CPU | errors |", "|---" * 13 + "|",
        *(_row(r, s, ch["items_per_s"]) for r in out["runs"]), "", where_cpu_went(out), "",
        f"Speed-up, items/s at {s['hosts']} hosts over 1: **{out['speedup']:.2f}×** (target "
        f"≥ {TARGET}×): **{verdict}**.", "",
        "Placement (read back with `raybatch status --json`): " + "; ".join(
            f"k={r['k']}: replicas on {', '.join(r['placement']['replicas'])}, batching actor "
            f"on {', '.join(map(str, r['placement']['batching_actors']))}, ingress on "
            f"{', '.join(map(str, r['placement']['ingress']))}" for r in out["runs"]) + ".",
        "", "![items/s against hosts](scale-out.png)", "",
        "The config of the widest run is result.json's `config`; each k redeploys the same "
        "app with min = max = k replicas.", ""])


def where_cpu_went(out: dict[str, Any]) -> str:
    """One paragraph: the replica's CPU per item against the model alone, Ray's own daemons
    on a host, and the head's spare, from the last (widest) run."""
    r, s = out["runs"][-1], out["settings"]
    roles = r["cpu"]["by_role"]
    hosts = [f"host{h}" for h in range(s["hosts"])]
    replica = sum(roles[h].get("model replica", 0.0) for h in hosts) / r["items_per_s"] * 1e3
    daemons = sum(v for h in hosts for n, v in roles[h].items() if n != "model replica")
    head = r["cpu"]["cores"]["head"]
    spare = (out["machine"]["cpus"] or 2) - s["hosts"] * s["cpus"]
    mine = roles["head"].get("ingress (Serve replica)", 0) + roles["head"].get("batching actor", 0)
    return (
        f"Where the CPU went at {r['k']} hosts: each replica host spent its whole quota, "
        f"{replica:.2f} ms of its replica process's CPU per item against "
        f"{out['cost_one_core']['cpu_ms_per_item']:.2f} ms for the model alone on one core "
        f"(the rest: taking batches off the connection, answering, Ray's worker threads), and "
        f"{daemons / s['hosts']:.3f} cores per host went to Ray's own processes there (raylet, "
        f"agents). The head used {head:.2f} cores of the {spare:.1f} the hosts leave on this "
        f"machine, of which the ingress and the batching actor {mine:.3f} "
        f"({mine / r['items_per_s'] * 1e3:.2f} ms per request); the rest is Ray's head "
        "(GCS, Serve controller, dashboard agents), busy or not. wrk used "
        f"{r['wrk_cpu_cores']:.3f} cores.")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--hosts", type=int, default=3, help="worker hosts (k runs 1..hosts)")
    ap.add_argument("--cpus", type=float, default=0.4, help="CPU quota of each worker host")
    ap.add_argument("--dim", type=int, default=128, help="MatChain's matrix size")
    ap.add_argument("--steps", type=int, default=150, help="MatChain's steps (cost per item)")
    ap.add_argument("--batch", type=int, default=8, help="max_batch_size")
    ap.add_argument("--per-host-connections", type=int, default=24,
                    help="wrk connections per replica host (C = this x k)")
    ap.add_argument("--duration", type=float, default=20.0, help="timed seconds per k")
    ap.add_argument("--warmup", type=float, default=5.0, help="warm-up seconds per k")
    day = datetime.now(timezone.utc).strftime("%Y-%m-%d")
    ap.add_argument("--results", type=Path,
                    default=REPO / "benchmarks" / "results" / f"{day}-scale-out-lab")
    ap.add_argument("--logs", type=Path, default=Path("/tmp/raybatch-scale-out-logs"),
                    help="Ray's and raybatch up's logs, and the configs deployed")
    args = ap.parse_args(argv)
    out = run(args)
    (args.results / "result.json").write_text(json.dumps(out, indent=2, default=str) + "\n")
    plot(out, args.results / "scale-out.png")
    (args.results / "README.md").write_text(readme(out))
    print(f"speed-up {out['speedup']:.2f}x at {args.hosts} hosts (target {TARGET}): "
          f"{'PASS' if out['met'] else 'MISS'}; results in {args.results}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
