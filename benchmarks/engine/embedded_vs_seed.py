"""Embedded `BatchedService` against the seed's design, in one run.

    python -m benchmarks.engine.embedded_vs_seed [--quick] [--json OUT]

For each model (sleep, mlp) and each concurrency C: the model's own ceiling,
then both hosts, back to back, each on a fresh service (so neither
carries queues, warm caches or polling threads into the other's point), under
the same settings: max batch 64, a 2 ms queue delay / fixed timeout, one model
worker process. The machine is shared, so what is reported are ratios taken
seconds apart: embedded/seed per point, and each host against the ceiling
measured just before it, with the 1-minute load average beside them.

Targets: at C=128 the embedded host reaches >= 0.85 of the
ceiling and >= 3x the seed's throughput; at C=1 its p50 is not above the seed's.
`OMP_NUM_THREADS=1` is set before torch loads (it loads lazily), for this process and the
workers it starts, because `torch.set_num_threads(1)` alone can leave an OpenMP
thread spinning a core.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import platform
import sys
import time
from dataclasses import asdict, dataclass
from typing import Any

from batching import BatchedService, DynamicPolicy
from benchmarks.common.loadgen import run_closed_loop
from benchmarks.common.models import MODELS, measure_ceiling
from benchmarks.common.results import save_json
from benchmarks.engine.seed_design import SeedService

CONCURRENCIES = (1, 16, 128, 512)
MAX_BATCH_SIZE = 64
DELAY_S = 0.002
TARGET_C, TARGET_CEILING_FRACTION, TARGET_SPEEDUP, LATENCY_C = 128, 0.85, 3.0, 1


@dataclass(frozen=True, slots=True)
class Settings:
    warmup_s: float
    duration_s: float
    ceiling_s: float
    concurrencies: tuple[int, ...] = CONCURRENCIES
    max_batch_size: int = MAX_BATCH_SIZE
    delay_s: float = DELAY_S
    max_inflight_batches: int = 2


FULL = Settings(warmup_s=1.0, duration_s=4.0, ceiling_s=1.0)
QUICK = Settings(warmup_s=0.5, duration_s=1.5, ceiling_s=0.5)


def make_service(system: str, model_cls: type, s: Settings) -> Any:
    if system == "embedded":
        policy = DynamicPolicy(max_batch_size=s.max_batch_size, max_queue_delay_s=s.delay_s)
        return BatchedService(model_cls, policy=policy,
                              max_inflight_batches=s.max_inflight_batches)
    return SeedService(model_cls, max_batch_size=s.max_batch_size, timeout_s=s.delay_s)


async def measure_point(system: str, model: str, c: int, s: Settings) -> dict[str, Any]:
    model_cls, payloads_fn = MODELS[model]
    async with make_service(system, model_cls, s) as svc:
        result = await run_closed_loop(svc.submit, payloads_fn(16), concurrency=c,
                                       duration_s=s.duration_s, warmup_s=s.warmup_s,
                                       stats=svc.stats)
    return result.as_dict()


async def measure_model(model: str, s: Settings) -> dict[str, Any]:
    model_cls, payloads_fn = MODELS[model]
    points = []
    for c in s.concurrencies:
        # The ceiling again beside every point: other people's load drifts within minutes.
        ceiling = measure_ceiling(model_cls, payloads_fn(16), batch_size=s.max_batch_size,
                                  duration_s=s.ceiling_s)
        point: dict[str, Any] = {"concurrency": c, "ceiling_items_per_s": ceiling,
                                 "loadavg_1m": os.getloadavg()[0]}
        _progress(f"{model} C={c:<4} ceiling  {ceiling:>9,.0f} items/s")
        for system in ("embedded", "seed"):
            r = await measure_point(system, model, c, s)
            r["fraction_of_ceiling"] = r["throughput_rps"] / ceiling
            point[system] = r
            _progress(f"{model} C={c:<4} {system:<8} {r['throughput_rps']:>9,.0f} req/s "
                      f"p50 {r['p50_ms']:7.2f} ms  batch {r['mean_batch_size'] or 0:5.1f}")
        e, d = point["embedded"], point["seed"]
        point["throughput_ratio"] = _ratio(e["throughput_rps"], d["throughput_rps"])
        point["p50_ratio"] = _ratio(e["p50_ms"], d["p50_ms"])
        points.append(point)
    ceilings = sorted(p["ceiling_items_per_s"] for p in points)
    return {"ceiling_items_per_s_median": ceilings[len(ceilings) // 2],
            "points": points, "targets": targets(points)}


def targets(points: list[dict[str, Any]]) -> list[dict[str, Any]]:
    by_c = {p["concurrency"]: p for p in points}
    out = []
    if (p := by_c.get(TARGET_C)) is not None:
        frac = p["embedded"]["fraction_of_ceiling"]
        out.append({"name": f"C={TARGET_C} embedded >= {TARGET_CEILING_FRACTION} of ceiling",
                    "value": frac, "passed": frac >= TARGET_CEILING_FRACTION})
        out.append({"name": f"C={TARGET_C} embedded >= {TARGET_SPEEDUP}x seed",
                    "value": p["throughput_ratio"],
                    "passed": p["throughput_ratio"] >= TARGET_SPEEDUP})
    if (p := by_c.get(LATENCY_C)) is not None:
        out.append({"name": f"C={LATENCY_C} embedded p50 <= seed p50",
                    "value": p["p50_ratio"], "passed": p["p50_ratio"] <= 1.0})
    return out


def _ratio(a: float, b: float) -> float:
    return a / b if b else float("inf")


def _progress(line: str) -> None:
    print(line, file=sys.stderr, flush=True)


def render(results: dict[str, Any]) -> str:
    head = (f"{'model':<6}{'C':>5} | {'req/s emb':>10}{'seed':>9}{'emb/seed':>9} | "
            f"{'%ceil emb':>10}{'seed':>6} | {'p50 ms emb':>11}{'seed':>7}{'ratio':>6} | "
            f"{'p99 ms emb':>11}{'seed':>7} | {'batch emb':>10}{'seed':>6} | "
            f"{'cpu us/req emb':>15}{'seed':>6} | {'ceiling':>8}{'load':>6}")
    lines = [head, "-" * len(head)]
    for model, m in results["models"].items():
        for p in m["points"]:
            e, d = p["embedded"], p["seed"]
            lines.append(
                f"{model:<6}{p['concurrency']:>5} | {e['throughput_rps']:>10,.0f}"
                f"{d['throughput_rps']:>9,.0f}{p['throughput_ratio']:>8.2f}x | "
                f"{e['fraction_of_ceiling']:>9.0%}{d['fraction_of_ceiling']:>7.0%} | "
                f"{e['p50_ms']:>11.2f}{d['p50_ms']:>7.2f}{p['p50_ratio']:>6.2f} | "
                f"{e['p99_ms']:>11.2f}{d['p99_ms']:>7.2f} | "
                f"{e['mean_batch_size'] or 0:>10.1f}{d['mean_batch_size'] or 0:>6.1f} | "
                f"{e['client_cpu_us_per_req']:>15.0f}{d['client_cpu_us_per_req']:>6.0f} | "
                f"{p['ceiling_items_per_s']:>8,.0f}{p['loadavg_1m']:>6.2f}")
    lines.append(f"ceiling: the model alone on full batches of "
                 f"{results['settings']['max_batch_size']}, in-process, items/s, measured "
                 f"beside each point; load: 1-minute load average then")
    lines.append("")
    for model, m in results["models"].items():
        for t in m["targets"]:
            lines.append(f"{'PASS' if t['passed'] else 'FAIL'}  {model:<6}{t['name']}: "
                         f"{t['value']:.2f}")
    errors = [(model, p["concurrency"], sys_, p[sys_]["errors"], p[sys_]["first_error"])
              for model, m in results["models"].items() for p in m["points"]
              for sys_ in ("embedded", "seed") if p[sys_]["errors"]]
    lines += [f"ERRORS {m} C={c} {s}: {n} (first: {err})" for m, c, s, n, err in errors]
    return "\n".join(lines)


async def main_async(s: Settings, models: list[str]) -> dict[str, Any]:
    results: dict[str, Any] = {
        "settings": asdict(s),
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version(),
                    "loadavg_start": os.getloadavg()},
        "models": {},
    }
    t0 = time.perf_counter()
    for model in models:
        results["models"][model] = await measure_model(model, s)
    results["machine"]["loadavg_end"] = os.getloadavg()
    results["wall_s"] = time.perf_counter() - t0
    return results


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="short points (~1 minute in all)")
    ap.add_argument("--json", metavar="OUT", help="also write the results as JSON here")
    ap.add_argument("--models", nargs="+", choices=sorted(MODELS), default=["sleep", "mlp"])
    ap.add_argument("--concurrency", nargs="+", type=int, metavar="C",
                    help=f"concurrencies to run (default {' '.join(map(str, CONCURRENCIES))})")
    args = ap.parse_args(argv)
    # Before torch loads anywhere (models import it lazily), so workers inherit it too.
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    s = QUICK if args.quick else FULL
    if args.concurrency:
        s = Settings(**{**asdict(s), "concurrencies": tuple(args.concurrency)})
    results = asyncio.run(main_async(s, args.models))
    print(render(results))
    print(f"\nwall {results['wall_s']:.0f} s, load average {results['machine']['loadavg_start']}"
          f" -> {results['machine']['loadavg_end']} on {results['machine']['cpus']} CPUs")
    save_json(args.json, results)


if __name__ == "__main__":
    main()
