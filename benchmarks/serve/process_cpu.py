"""Where a request's CPU goes, process by process, on each shape `benchmarks.peers` runs.

    flock /tmp/raybatch-ray.lock python -m benchmarks.serve.process_cpu \
        [--shapes actor inproc] [--concurrency 128] [--duration 10] [--rounds 2]

Starts `raybatch up` as `benchmarks.peers` does (the demo's mlp alone, one replica: the
mission's shape with a batching actor and a replica actor, or the in-process shortcut),
checks its answer, drives it with wrk (OIP binary) and reads each Ray process's user and
system CPU from /proc over the timed window, per request answered. The shapes alternate, `--rounds`
times, so a neighbour's load falls on both. What it answers: which process pays what
the in-process shortcut does not (the batching actor's and the replica's own work, the
hops between them), and whether that is user time (Python) or system time (sockets,
wake-ups). Also printed per run: the machine's idle share over the window (/proc/stat:
is the shape short of CPU, or of something else?) and the engine's own statistics
(`/v2/models/mlp/stats`, since the start: mean batch, a request's wait in the queue and
its time from arrival at the engine to its answer, a batch's compute in the replica).
`--override '{"replicas": {"max_inflight_batches": 1}}'` merges settings into the mlp's
config sections for an experiment (both shapes get them).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import tempfile
import urllib.request
from pathlib import Path
from typing import Any

from benchmarks.common.wrk import run_wrk
from benchmarks.peers.measure import check_answer
from benchmarks.peers.systems import model_input_and_answer, start_raybatch, stop

CLK_TCK = os.sysconf("SC_CLK_TCK")
ROLES = ("ServeReplica", "BatcherActor", "ModelReplica", "ProxyActor", "ServeController",
         "raylet", "gcs_server")  # the Ray processes of one `raybatch up`, by name


def ray_processes() -> dict[str, list[int]]:
    """Role -> pids of the live Ray processes (by their command line)."""
    out: dict[str, list[int]] = {}
    ps = subprocess.run(["ps", "-eo", "pid,args"], capture_output=True, text=True).stdout
    for line in ps.splitlines()[1:]:
        pid, _, args = line.strip().partition(" ")
        role = next((r for r in ROLES if r in args), None)
        if role is not None:
            out.setdefault(role, []).append(int(pid))
    return out


def cpu_s(pid: int) -> tuple[float, float]:
    """(user, system) seconds of `pid`; zeros once it has ended."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0, 0.0
    return int(fields[11]) / CLK_TCK, int(fields[12]) / CLK_TCK


def machine_ticks() -> list[int]:
    """The machine's CPU ticks by state (/proc/stat's first line: user, nice, system, idle,
    iowait, ...)."""
    with open("/proc/stat") as f:
        return [int(v) for v in f.readline().split()[1:]]


def engine_stats(base_url: str) -> dict[str, float]:
    """The mlp engine's statistics since the start, per request and per batch."""
    with urllib.request.urlopen(f"{base_url}/v2/models/mlp/stats", timeout=5) as r:
        s = json.loads(r.read())["model_stats"][0]
    stats, batches, items = s["inference_stats"], s["execution_count"], s["inference_count"]
    return {"mean_batch": items / max(batches, 1),
            "queue_us": stats["queue"]["ns"] / 1e3 / max(stats["queue"]["count"], 1),
            "answer_us": stats["success"]["ns"] / 1e3 / max(stats["success"]["count"], 1),
            "compute_us": stats["compute_infer"]["ns"] / 1e3 / max(batches, 1)}


def measure(shape: str, connections: int, duration_s: float, port: int,
            override: dict[str, Any] | None = None) -> dict:
    x, expected = model_input_and_answer()
    with tempfile.TemporaryDirectory() as tmp:
        server = start_raybatch(x, port, Path(tmp), None, inproc=shape == "inproc",
                                override=override)
        try:
            return _timed(shape, server, expected, connections, duration_s)
        finally:
            stop(server)


def _timed(shape: str, server: Any, expected: Any, connections: int,
           duration_s: float) -> dict:
    """A warm-up, then `duration_s` of load with the CPU of each Ray process read around it."""
    binary = server.variants[0]
    url = server.base_url + binary.path
    check_answer(url, binary.body, binary.headers, binary.decode, expected)  # or raise
    run_wrk(url, binary.body, binary.headers, connections=connections, duration_s=3)
    roles = ray_processes()
    before = {r: [cpu_s(p) for p in pids] for r, pids in roles.items()}
    ticks = machine_ticks()
    result = run_wrk(url, binary.body, binary.headers, connections=connections,
                     duration_s=duration_s)
    ticks = [b - a for a, b in zip(ticks, machine_ticks())]
    n = result.requests or 1
    per_role = {}
    for role, pids in roles.items():
        user = sum(cpu_s(p)[0] - b[0] for p, b in zip(pids, before[role]))
        system = sum(cpu_s(p)[1] - b[1] for p, b in zip(pids, before[role]))
        per_role[role] = (1e6 * user / n, 1e6 * system / n)
    return {"shape": shape, "req_s": result.throughput_rps, "p50_ms": result.p50_ms,
            "errors": result.errors, "us_per_request": per_role,
            "idle": (ticks[3] + ticks[4]) / max(sum(ticks), 1),
            "engine": engine_stats(server.base_url)}


def render(row: dict) -> str:
    parts = [f"{row['shape']:7s} {row['req_s']:9,.0f} req/s  p50 {row['p50_ms']:6.2f} ms"]
    total = 0.0
    for role in ROLES:
        if role in row["us_per_request"]:
            user, system = row["us_per_request"][role]
            total += user + system
            parts.append(f"  {role:15s} user {user:6.1f}  sys {system:6.1f} µs/req")
    parts.append(f"  {'all':15s} {total:6.1f} µs/req")
    e = row["engine"]
    parts.append(f"  machine idle {100 * row['idle']:.1f}%; engine: mean batch "
                 f"{e['mean_batch']:.1f}, queue {e['queue_us']:.0f} µs, arrival to answer "
                 f"{e['answer_us']:.0f} µs, compute {e['compute_us']:.0f} µs a batch")
    return "\n".join(parts)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--shapes", nargs="+", choices=("actor", "inproc"),
                   default=["actor", "inproc"])
    p.add_argument("--concurrency", type=int, default=128)
    p.add_argument("--duration", type=float, default=10.0)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--port", type=int, default=18200)
    p.add_argument("--override", type=json.loads, default={},
                   help="JSON: settings merged into the mlp's config sections")
    args = p.parse_args(argv)
    for _ in range(args.rounds):
        for shape in args.shapes:
            print(render(measure(shape, args.concurrency, args.duration, args.port,
                                 args.override)), flush=True)
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs")


if __name__ == "__main__":
    main()
