"""Sequence batching against running the same sequences unbatched, in process.

    python -m benchmarks.generation.sequences [--sequences 64] [--steps 20] [--batch-overhead-ms 1]
                                   [--rounds 3] [--json OUT]

64 concurrent clients each run one GRU sequence of 20 steps (start, 18 steps,
end), awaiting each step's output before sending the next. The host is a real
`SequenceHost`; the replica is a `StateStore` over `deployments.models.stateful.GRU`
run in one worker thread (a sync replica does one batch at a time), and every
batch also sleeps `--batch-overhead-ms` in that thread, a stand-in for the Ray
hop a real replica call costs (0.65-0.8 ms of CPU per empty actor call here).

Configurations, each on a fresh host and replica, best of `--rounds`:
  direct    strategy=direct, max_batch_size = the number of sequences (a slot each)
  oldest    strategy=oldest, max_batch_size = candidates = the number of sequences
  unbatched strategy=oldest, max_batch_size=1 with as many candidates: the same
            concurrency, but every request is its own batch
Reported: requests/s, p50/p99 request latency (submit to output), the mean
batch size, and each batched configuration's throughput over the unbatched one.
`OMP_NUM_THREADS=1` before torch loads, and the GRU runs on one torch thread.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from batching.sequence.batcher import SequenceRequest
from batching.sequence.host import SequenceHost
from batching.sequence.policy import SequencePolicy
from batching.sequence.stateful import SequenceBatchInput, StateStore
from benchmarks.common.results import save_json
from deployments.models.stateful import GRU

# torch loads lazily (in GRU.setup), so this still reaches OpenMP before it starts.
os.environ.setdefault("OMP_NUM_THREADS", "1")


class ThreadReplica:
    """A SequenceReplicaClient running a StateStore in one worker thread."""

    def __init__(self, model: GRU, overhead_s: float) -> None:
        self.name = "thread-replica"
        self.store = StateStore(model)
        self.overhead_s = overhead_s
        self._pool = ThreadPoolExecutor(max_workers=1)

    def _run(self, batch: SequenceBatchInput) -> tuple[list, float]:
        t0 = time.perf_counter()
        if self.overhead_s:
            time.sleep(self.overhead_s)
        results = self.store.run(batch)
        return results, time.perf_counter() - t0

    async def run(self, batch: SequenceBatchInput) -> tuple[list, float]:
        return await asyncio.get_running_loop().run_in_executor(self._pool, self._run, batch)

    async def release(self, sequence_ids: list) -> None:
        await asyncio.get_running_loop().run_in_executor(self._pool, self.store.release,
                                                         sequence_ids)

    def close(self) -> None:
        self._pool.shutdown(wait=True)


@dataclass(frozen=True, slots=True)
class Figures:
    name: str
    requests: int
    wall_s: float
    requests_per_s: float
    p50_ms: float
    p99_ms: float
    batches: int
    mean_batch_size: float


def policies(n: int) -> dict[str, SequencePolicy]:
    return {
        "direct": SequencePolicy(strategy="direct", max_batch_size=n),
        "oldest": SequencePolicy(strategy="oldest", max_batch_size=n, max_candidate_sequences=n),
        "unbatched": SequencePolicy(strategy="oldest", max_batch_size=1,
                                    max_candidate_sequences=n),
    }


async def one_sequence(host: SequenceHost, sid: Any, inputs: Sequence[Any],
                       latencies: list[float]) -> list[Any]:
    """Send one sequence's steps in order, each once the previous one's output arrived
    (start on the first, end on the last); returns the outputs."""
    steps, outputs = len(inputs), []
    for i, x in enumerate(inputs):
        t0 = time.perf_counter()
        outputs.append(await host.submit(SequenceRequest(f"{sid}/{i}", sid, x, start=i == 0,
                                                         end=i == steps - 1)))
        latencies.append(time.perf_counter() - t0)
    return outputs


async def run_once(name: str, policy: SequencePolicy, model: GRU, xs: np.ndarray,
                   overhead_s: float) -> Figures:
    replica = ThreadReplica(model, overhead_s)
    host = SequenceHost(policy, max_inflight=2)
    host.add_replica(replica)
    latencies: list[float] = []
    t0 = time.perf_counter()
    await asyncio.gather(*(one_sequence(host, s + 1, xs[s], latencies)
                           for s in range(len(xs))))
    wall_s = time.perf_counter() - t0
    stats = host.stats()
    replica.close()
    lat_ms = np.array(latencies) * 1e3
    return Figures(name, len(latencies), round(wall_s, 4), round(len(latencies) / wall_s, 1),
                   round(float(np.percentile(lat_ms, 50)), 3),
                   round(float(np.percentile(lat_ms, 99)), 3),
                   stats["batches"], stats["mean_batch_size"])


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    model = GRU()
    model.setup("cpu")
    rng = np.random.default_rng(0)
    xs = rng.standard_normal((args.sequences, args.steps, 8), dtype=np.float32)
    overhead_s = args.batch_overhead_ms / 1e3
    await run_once("warm-up", policies(args.sequences)["direct"], model, xs[:8], overhead_s)
    best: dict[str, Figures] = {}
    for _ in range(args.rounds):
        for name, policy in policies(args.sequences).items():
            fig = await run_once(name, policy, model, xs, overhead_s)
            if name not in best or fig.requests_per_s > best[name].requests_per_s:
                best[name] = fig
    base = best["unbatched"].requests_per_s
    return {
        "sequences": args.sequences, "steps": args.steps,
        "batch_overhead_ms": args.batch_overhead_ms, "rounds": args.rounds,
        "load_1min": round(os.getloadavg()[0], 2),
        "results": {name: asdict(fig) for name, fig in best.items()},
        "speedup_vs_unbatched": {name: round(best[name].requests_per_s / base, 2)
                                 for name in ("direct", "oldest")},
    }


def main(argv: list[str] | None = None) -> dict[str, Any]:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sequences", type=int, default=64)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--batch-overhead-ms", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--json", metavar="PATH", help="write the figures here as JSON")
    args = ap.parse_args(argv)
    out = asyncio.run(main_async(args))
    print(f"{args.sequences} sequences x {args.steps} steps, GRU, "
          f"{args.batch_overhead_ms} ms per batch overhead, best of {args.rounds} "
          f"(load {out['load_1min']})")
    print(f"{'config':10s} {'req/s':>9s} {'p50 ms':>8s} {'p99 ms':>8s} {'batches':>8s} "
          f"{'mean bs':>8s}")
    for name, fig in out["results"].items():
        print(f"{name:10s} {fig['requests_per_s']:9.1f} {fig['p50_ms']:8.2f} "
              f"{fig['p99_ms']:8.2f} {fig['batches']:8d} {fig['mean_batch_size']:8.2f}")
    for name, ratio in out["speedup_vs_unbatched"].items():
        print(f"{name} / unbatched throughput: {ratio:.2f}x")
    save_json(args.json, out)
    return out


if __name__ == "__main__":
    main()
