"""Ragged items: `minilm` on sentences of mixed lengths, with and without group_by_length.

    python -m benchmarks.serve.ragged [--concurrency 64 256] [--duration 15] [--rounds 2]
        [--long-share 0.25] [--json OUT]

A batch of sentences is padded to its longest one inside the model (the tokenizer
pads to the batch's longest), so a batch of 31 short sentences and one long one
computes 32 long ones. Two copies of `minilm` run in one local Ray, each one replica
on one CPU, identical but for `batching.group_by_length`: `minilm` (off: strict
arrival order) and `minilm-grouped` (on: each batch starts with the oldest request
and takes the queued ones nearest to it in length). The sentences mix short ones
(4-12 words) with a `--long-share` of long ones (80-160 words), in a fixed random
order. Each point is driven closed-loop through `RaybatchClient` (one sentence per
request, C clients), and the two models alternate `--rounds` times so drift in the
machine's load hits both alike. Reported per point: sentences/s, p50/p99, mean
batch size, the ratio grouped/plain, and the CPU of this process (the client).

On a shared 2-core machine absolute numbers mean little; the ratio measured in the
same run is the result.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import time
from typing import Any

import numpy as np

from benchmarks.common.loadgen import run_closed_loop
from benchmarks.common.results import save_json
from benchmarks.serve.drivers import StatsPoller
from benchmarks.serve.models import _WORDS

MODELS = ("minilm", "minilm-grouped")


def mixed_sentences(n: int, long_share: float, seed: int = 0) -> list[str]:
    """`n` sentences: short ones of 4-12 words, a `long_share` of long ones of 80-160."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        words = (rng.integers(80, 161) if rng.random() < long_share
                 else rng.integers(4, 13))
        out.append(" ".join(rng.choice(_WORDS, size=int(words))).capitalize() + ".")
    return out


def app_config(max_batch_size: int, delay_s: float) -> dict[str, Any]:
    def model(name: str, grouped: bool) -> dict[str, Any]:
        return {
            "name": name, "transformer": "deployments.models:MiniLM",
            "inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": [-1]}],
            "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1, 384]}],
            "batching": {"max_batch_size": max_batch_size, "max_queue_delay_s": delay_s,
                         "group_by_length": grouped},
            "replicas": {"min_replicas": 1, "max_replicas": 1, "num_cpus": 1, "pin": "off"},
            "warmup": {"batch_sizes": [1, max_batch_size]},
        }
    return {"app_name": "ragged", "ingress": {"num_cpus": 0, "route_prefix": "/ragged",
                                              "grpc_port": None},
            "models": [model(MODELS[0], False), model(MODELS[1], True)]}


async def measure(client: Any, handle: Any, model: str, payloads: list[np.ndarray],
                  concurrency: int, duration_s: float) -> dict[str, Any]:
    async def fetch() -> dict[str, Any]:
        return (await handle.status.remote())[model]

    async def submit(x: np.ndarray) -> Any:
        return await client.infer(model, {"INPUT0": x})

    async with StatsPoller(fetch) as poller:
        r = await run_closed_loop(submit, payloads, concurrency=concurrency,
                                  duration_s=duration_s, warmup_s=2.0, stats=poller)
    return {"sentences_per_s": r.throughput_rps, "p50_ms": r.p50_ms, "p99_ms": r.p99_ms,
            "mean_batch_size": r.mean_batch_size, "errors": r.errors,
            "client_cpu_us_per_req": r.client_cpu_us_per_req, "first_error": r.first_error}


async def main_async(args: argparse.Namespace) -> dict[str, Any]:
    import ray
    from ray import serve

    from cluster.config import load_config
    from deployments.app import build_app
    from deployments.ingress.client import RaybatchClient

    ray.init(address="local", num_cpus=args.num_cpus, include_dashboard=False,
             log_to_driver=False)
    results: dict[str, Any] = {"settings": vars(args), "loadavg_start": os.getloadavg(),
                               "points": {}}
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": args.port})
        config = load_config(app_config(args.max_batch_size, args.delay_s))
        handle = serve.run(build_app(config), name=config.app_name, route_prefix="/ragged")
        client = RaybatchClient(handle)
        texts = mixed_sentences(2048, args.long_share)
        payloads = [np.array([t.encode()], dtype=object) for t in texts]
        words = np.array([len(t.split()) for t in texts])
        results["sentences"] = {"count": len(texts), "mean_words": float(words.mean()),
                                "long_share": float((words >= 80).mean())}
        for c in args.concurrency:
            runs: dict[str, list[dict[str, Any]]] = {m: [] for m in MODELS}
            for _ in range(args.rounds):
                for model in MODELS:
                    runs[model].append(await measure(client, handle, model, payloads, c,
                                                     args.duration))
                    print(f"C={c} {model}: {runs[model][-1]}", flush=True)
            results["points"][str(c)] = summarize(runs)
    finally:
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: None)
        await serve.shutdown_async()
        ray.shutdown()
    results["loadavg_end"] = os.getloadavg()
    return results


def summarize(runs: dict[str, list[dict[str, Any]]]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for model, rs in runs.items():
        out[model] = {k: float(np.mean([r[k] for r in rs])) for k in
                      ("sentences_per_s", "p50_ms", "p99_ms", "mean_batch_size",
                       "client_cpu_us_per_req")}
        out[model]["per_round_sentences_per_s"] = [round(r["sentences_per_s"], 1) for r in rs]
        out[model]["errors"] = sum(r["errors"] for r in rs)
    out["grouped_over_plain"] = (out[MODELS[1]]["sentences_per_s"]
                                 / out[MODELS[0]]["sentences_per_s"])
    return out


def report(results: dict[str, Any]) -> str:
    s = results["sentences"]
    lines = [f"minilm, {s['count']} sentences, mean {s['mean_words']:.1f} words, "
             f"{s['long_share']:.0%} long (80-160 words); one replica on one CPU each",
             f"{'C':>5} {'model':16} {'sent/s':>8} {'p50 ms':>8} {'p99 ms':>8} "
             f"{'batch':>6} {'client us/req':>14}"]
    for c, point in results["points"].items():
        for model in MODELS:
            p = point[model]
            lines.append(f"{c:>5} {model:16} {p['sentences_per_s']:8.1f} {p['p50_ms']:8.1f} "
                         f"{p['p99_ms']:8.1f} {p['mean_batch_size']:6.1f} "
                         f"{p['client_cpu_us_per_req']:14.0f}")
        lines.append(f"{c:>5} grouped / plain: {point['grouped_over_plain']:.2f}x")
    return "\n".join(lines)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--concurrency", type=int, nargs="+", default=[64, 256])
    p.add_argument("--duration", type=float, default=15.0, help="seconds per measured window")
    p.add_argument("--rounds", type=int, default=2, help="alternations of the two models")
    p.add_argument("--long-share", type=float, default=0.25)
    p.add_argument("--max-batch-size", type=int, default=32)
    p.add_argument("--delay-s", type=float, default=0.005)
    p.add_argument("--num-cpus", type=int, default=2)
    p.add_argument("--port", type=int, default=8123)
    p.add_argument("--json", help="write the results here")
    args = p.parse_args()
    t0 = time.perf_counter()
    results = asyncio.run(main_async(args))
    results["wall_s"] = time.perf_counter() - t0
    print(report(results))
    save_json(args.json, results)


if __name__ == "__main__":
    main()
