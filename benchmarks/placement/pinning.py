"""Pinned vs unpinned: two CPU replicas of `mlp`, alone and beside a CPU-hungry neighbour.

    python -m benchmarks.placement.pinning [--duration S] [--rounds N] [--neighbours K] [--json OUT]

Two replicas, each its own process: two embedded `BatchedService`s (one worker
process each, `max_batch_size` 64, 2 ms delay, two batches in flight), driven
closed-loop from this process with half the clients each. Pinned, each worker
calls `cluster.pinning.pin_replica` (pin: required, one core) before it builds
the model, so the two take different physical cores through the node-local
allocator, with one torch thread; unpinned, the same worker with one torch
thread floats over every core. The neighbour is K busy-loop Python processes at
normal priority. Four cases, each run `--rounds` times alternating pinned and
unpinned; reported per case: the median throughput and p99 of the rounds, the
workers' CPU affinity as read back, and the ratios pinned / unpinned.
The load generator and both hosts live in this process and float: on a 2-core
machine they compete with the workers in every case, equally.

Default: 4 cases × 3 rounds × (4 s + 1 s warm-up + start-up): about 100 s. The
1-minute load average is printed before and after: other work on the machine
shows there first.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from statistics import median
from typing import Any

from batching import BatchedService, DynamicPolicy
from benchmarks.common.loadgen import processes, run_closed_loop
from benchmarks.common.models import mlp_payloads
from benchmarks.common.results import save_json
from cluster.config import ReplicaConfig
from cluster.pinning import CORES_FILE_ENV, pin_replica
from deployments.models import MLP

POLICY = DynamicPolicy(max_batch_size=64, max_queue_delay_s=0.002)
REPLICAS = 2


class PinnedMLP(MLP):
    """`mlp` that pins its process first, as a Ray replica does in its constructor."""

    def setup(self, device: str) -> None:
        pin_replica(ReplicaConfig(num_cpus=1, pin="required"), owner="benchmarks.placement.pinning")
        super().setup(device)


def start_neighbours(k: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(k)]


def stop(procs: list[subprocess.Popen]) -> None:
    for p in procs:
        p.kill()
    for p in procs:
        p.wait()


def worker_affinity(exclude: set[int]) -> list[list[int]]:
    """CPUs of this process's child processes (the model workers), as the kernel has them."""
    me = os.getpid()
    kids = sorted(pid for pid, (ppid, _) in processes().items()
                  if ppid == me and pid not in exclude)
    out = []
    for pid in kids:
        try:
            out.append(sorted(os.sched_getaffinity(pid)))
        except OSError:
            continue
    return out


async def one_case(pinned: bool, neighbours: int, args: argparse.Namespace) -> dict[str, Any]:
    cores_file = Path(tempfile.mkdtemp(prefix="raybatch-bench-")) / "cores.json"
    model = PinnedMLP if pinned else MLP
    services = [BatchedService(model, policy=POLICY, init_kwargs={"threads": 1},
                               env={CORES_FILE_ENV: str(cores_file), "OMP_NUM_THREADS": "1"})
                for _ in range(REPLICAS)]
    for svc in services:
        await svc.start()
    hungry = start_neighbours(neighbours)
    try:
        affinity = worker_affinity({p.pid for p in hungry})
        turn = iter(range(1 << 62))

        async def submit(x: Any) -> Any:  # round robin over the replicas
            return await services[next(turn) % REPLICAS].submit(x)

        def stats() -> dict[str, int]:
            each = [svc.stats() for svc in services]
            return {k: sum(s[k] for s in each) for k in ("batches", "items")}

        r = await run_closed_loop(submit, mlp_payloads(), concurrency=args.concurrency,
                                  duration_s=args.duration, warmup_s=args.warmup, stats=stats)
    finally:
        stop(hungry)
        for svc in services:
            await svc.aclose()
    return {"pinned": pinned, "neighbours": neighbours, "affinity": affinity, **r.as_dict()}


def summarize(runs: list[dict[str, Any]]) -> dict[str, Any]:
    cases: dict[str, Any] = {}
    for neighbours in sorted({r["neighbours"] for r in runs}):
        for pinned in (True, False):
            these = [r for r in runs if r["pinned"] == pinned and r["neighbours"] == neighbours]
            cases[case_name(pinned, neighbours)] = {
                "throughput_rps": median(r["throughput_rps"] for r in these),
                "p99_ms": median(r["p99_ms"] for r in these),
                "p50_ms": median(r["p50_ms"] for r in these),
                "mean_batch_size": median(r["mean_batch_size"] or 0 for r in these),
                "rounds_rps": [round(r["throughput_rps"]) for r in these],
                "affinity": these[0]["affinity"],
            }
    ratios = {}
    for neighbours in sorted({r["neighbours"] for r in runs}):
        p, u = cases[case_name(True, neighbours)], cases[case_name(False, neighbours)]
        ratios["quiet" if not neighbours else "neighbour"] = {
            "throughput": p["throughput_rps"] / u["throughput_rps"],
            "p99": p["p99_ms"] / u["p99_ms"]}
    return {"cases": cases, "ratios_pinned_over_unpinned": ratios}


def case_name(pinned: bool, neighbours: int) -> str:
    return f"{'pinned' if pinned else 'unpinned'}, {'quiet' if not neighbours else 'neighbour'}"


def render(summary: dict[str, Any]) -> str:
    lines = [f"{'case':22s} {'req/s':>8s} {'p50 ms':>8s} {'p99 ms':>8s} {'batch':>6s}  "
             "rounds req/s      worker CPUs"]
    for name, c in summary["cases"].items():
        lines.append(f"{name:22s} {c['throughput_rps']:8.0f} {c['p50_ms']:8.2f} "
                     f"{c['p99_ms']:8.2f} {c['mean_batch_size']:6.1f}  "
                     f"{c['rounds_rps']!s:17s} {c['affinity']}")
    for where, r in summary["ratios_pinned_over_unpinned"].items():
        lines.append(f"pinned / unpinned, {where}: throughput ×{r['throughput']:.3f}, "
                     f"p99 ×{r['p99']:.3f}")
    return "\n".join(lines)


async def run(args: argparse.Namespace) -> dict[str, Any]:
    runs = []
    for rnd in range(args.rounds):
        for neighbours in (0, args.neighbours):
            # Alternate which goes first, so a drift in the machine does not favour one.
            for pinned in ((True, False) if rnd % 2 == 0 else (False, True)):
                r = await one_case(pinned, neighbours, args)
                print(f"  round {rnd + 1} {case_name(pinned, neighbours):22s} "
                      f"{r['throughput_rps']:8.0f} req/s  p99 {r['p99_ms']:7.2f} ms  "
                      f"workers on {r['affinity']}", flush=True)
                runs.append(r)
    return {"runs": runs, **summarize(runs)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--duration", type=float, default=4.0, help="measured seconds per run")
    p.add_argument("--warmup", type=float, default=1.0)
    p.add_argument("--rounds", type=int, default=3, help="runs per case, alternating order")
    p.add_argument("--neighbours", type=int, default=2, help="busy-loop processes beside")
    p.add_argument("--concurrency", type=int, default=128, help="closed-loop clients in all")
    p.add_argument("--json", metavar="OUT", help="write all runs and the summary here")
    args = p.parse_args(argv)
    t0 = time.perf_counter()
    print(f"pinned vs unpinned: {REPLICAS} mlp replicas, C={args.concurrency}, "
          f"{args.neighbours} busy-loop neighbours; CPUs {sorted(os.sched_getaffinity(0))}; "
          f"load {os.getloadavg()[0]:.2f}", flush=True)
    load_before = os.getloadavg()[0]
    result = asyncio.run(run(args))
    print(render(result))
    print(f"({time.perf_counter() - t0:.0f} s; load {os.getloadavg()[0]:.2f})")
    meta = {"machine": platform.machine(), "cpus": os.cpu_count(), "args": vars(args),
            "load1_before": load_before, "load1_after": os.getloadavg()[0]}
    save_json(args.json, {"meta": meta, **result})
    return 0


if __name__ == "__main__":
    sys.exit(main())
