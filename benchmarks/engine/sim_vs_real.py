"""The simulator against reality: the same policy, the real embedded host and its model.

The embedded `BatchedService` runs the sleep model (2 ms + 0.05 ms per item) in its
worker process under closed-loop and Poisson load; `batching.simulate.engine` runs the
same `DynamicPolicy` with the model's nominal latency `a + b·items` and the same
arrivals. Throughput and p50 latency must agree within 15%: the simulator is only
worth using to size a deployment if it predicts the one we can measure.

The simulator is calibrated from two measurements independent of the load points:
the model's own cost `a + b·n`, fitted from timing it in-process at two batch
sizes (this includes `time.sleep` overshoot), and the host's hop, half the round
trip of a zero-cost model through the same host at C=1 with no queue delay (pickle,
socket, event loop), plus the host's timer resolution (asyncio rounds a timer's
timeout up to the next millisecond). `--nominal` uses the model's nominal 2 ms + 0.05 ms/item and
no hop instead, to show what the calibration buys.

    python -m benchmarks.engine.sim_vs_real [--quick] [--json OUT]
"""

from __future__ import annotations

import argparse
import asyncio
import time

import numpy as np

from batching import BatchedService, DynamicPolicy
from batching.simulate.arrivals import ClosedLoop, Poisson
from batching.simulate.engine import simulate
from benchmarks.common.loadgen import run_closed_loop
from benchmarks.common.models import sleep_payloads
from benchmarks.common.results import save_json
from deployments.models import Sleep

A_S, B_S = 0.002, 0.00005
POLICY = DynamicPolicy(max_batch_size=64, max_queue_delay_s=0.002)
INFLIGHT = 2
TIMER_TICK_S = 0.001  # asyncio's epoll selector rounds timeouts up to whole milliseconds
TOLERANCE = 0.15


async def _poisson(svc: BatchedService, rate: float, duration_s: float, warmup_s: float,
                   seed: int = 0) -> dict:
    """Open loop: requests at Poisson times, whatever the service's state."""
    rng = np.random.default_rng(seed)
    payloads = sleep_payloads()
    lat: list[tuple[float, float]] = []  # (arrival offset, latency)
    tasks = []
    start = time.perf_counter()
    t = 0.0

    async def one(x, at):
        t0 = time.perf_counter()
        await svc.submit(x)
        lat.append((at, time.perf_counter() - t0))

    i = 0
    while t < warmup_s + duration_s:
        t += rng.exponential(1.0 / rate)
        delay = start + t - time.perf_counter()
        if delay > 0:
            await asyncio.sleep(delay)
        tasks.append(asyncio.ensure_future(one(payloads[i % len(payloads)], t)))
        i += 1
    await asyncio.gather(*tasks)
    window = [d for at, d in lat if at >= warmup_s]
    return {"throughput_rps": len(window) / duration_s,
            "p50_ms": float(np.percentile(window, 50) * 1e3)}


def fit_model_cost(reps: int = 200) -> tuple[float, float]:
    """(a, b) of the sleep model timed in this process at batch sizes 1 and 64."""
    model = Sleep()
    times = {}
    for n in (1, 64):
        items = sleep_payloads(n)
        t0 = time.perf_counter()
        for _ in range(reps):
            model(items)
        times[n] = (time.perf_counter() - t0) / reps
    b = (times[64] - times[1]) / 63
    return times[1] - b, b


async def measure_hop_s(requests: int = 400) -> float:
    """Half the round trip of a zero-cost model through the embedded host."""
    policy = DynamicPolicy(max_batch_size=64, max_queue_delay_s=0.0)
    async with BatchedService(Sleep, policy=policy, init_args=(0.0, 0.0)) as svc:
        x = sleep_payloads(1)[0]
        lat = []
        for _ in range(requests):
            t0 = time.perf_counter()
            await svc.submit(x)
            lat.append(time.perf_counter() - t0)
    return float(np.median(lat[requests // 4:])) / 2


async def _real(kind: str, value: float, duration_s: float, warmup_s: float) -> dict:
    async with BatchedService(Sleep, policy=POLICY, max_inflight_batches=INFLIGHT) as svc:
        if kind == "closed":
            r = await run_closed_loop(svc.submit, sleep_payloads(), concurrency=int(value),
                                      duration_s=duration_s, warmup_s=warmup_s,
                                      stats=svc.stats)
            return {"throughput_rps": r.throughput_rps, "p50_ms": r.p50_ms}
        return await _poisson(svc, value, duration_s, warmup_s)


def _sim(kind: str, value: float, duration_s: float, warmup_s: float,
         cost: tuple[float, float, float]) -> dict:
    a_s, b_s, hop_s, tick_s = cost
    arrivals = ClosedLoop(int(value)) if kind == "closed" else Poisson(value)
    r = simulate(POLICY, arrivals, latency_a_s=a_s, latency_b_s=b_s, hop_s=hop_s,
                 timer_tick_s=tick_s,
                 max_inflight=INFLIGHT, duration_s=warmup_s + duration_s, warmup_s=warmup_s)
    return {"throughput_rps": r.throughput_rps, "p50_ms": r.latency_ms["p50"]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--quick", action="store_true", help="shorter points (~30 s in all)")
    p.add_argument("--json", help="write the results here")
    p.add_argument("--nominal", action="store_true",
                   help="simulate with the nominal model cost and no hop (uncalibrated)")
    args = p.parse_args(argv)
    if args.nominal:
        cost = (A_S, B_S, 0.0, 0.0)
    else:
        a_s, b_s = fit_model_cost()
        cost = (a_s, b_s, asyncio.run(measure_hop_s()), TIMER_TICK_S)
    print(f"simulated model: {cost[0] * 1e3:.3f} ms + {cost[1] * 1e3:.4f} ms/item, "
          f"hop {cost[2] * 1e3:.3f} ms each way, timer tick {cost[3] * 1e3:g} ms"
          f"{' (nominal)' if args.nominal else ' (calibrated)'}")
    duration_s, warmup_s = (2.0, 0.5) if args.quick else (5.0, 1.0)
    points = [("closed", 1), ("closed", 16), ("closed", 128),
              ("poisson", 1000), ("poisson", 5000), ("poisson", 9000)]
    rows, ok = [], True
    print(f"{'load':>14} | {'real req/s':>10} {'sim req/s':>10} {'err':>6} | "
          f"{'real p50':>8} {'sim p50':>8} {'err':>6}")
    for kind, value in points:
        real = asyncio.run(_real(kind, value, duration_s, warmup_s))
        sim = _sim(kind, value, duration_s, warmup_s, cost)
        err_t = sim["throughput_rps"] / real["throughput_rps"] - 1
        err_p = sim["p50_ms"] / real["p50_ms"] - 1
        ok &= abs(err_t) <= TOLERANCE and abs(err_p) <= TOLERANCE
        label = f"C={value}" if kind == "closed" else f"{value}/s Poisson"
        print(f"{label:>14} | {real['throughput_rps']:10.0f} {sim['throughput_rps']:10.0f} "
              f"{err_t:+6.1%} | {real['p50_ms']:8.2f} {sim['p50_ms']:8.2f} {err_p:+6.1%}")
        rows.append({"load": kind, "value": value, "real": real, "sim": sim,
                     "throughput_error": err_t, "p50_error": err_p})
    print(f"\n{'PASS' if ok else 'FAIL'}: simulator within {TOLERANCE:.0%} of the real host "
          "on throughput and p50 at every point")
    save_json(args.json, {"model_a_s": cost[0], "model_b_s": cost[1], "hop_s": cost[2],
                          "points": rows, "pass": ok})
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
