"""Where a `RaybatchClient` bundle's round trip goes: the probe behind the
"RaybatchClient >= 0.95 of the ceiling" target's analysis (docs/performance.md).

    python -m benchmarks.serve.client_roundtrip [--model sleep] [--rounds 30]

Deploys one model as `benchmarks.serve.compare --custom ingress+idle+inproc` does (engine and
replica in the ingress), then, one round at a time (nothing else in flight): 1 request,
and 64 requests at once (one bundle, one full batch), through `RaybatchClient`; a bare
handle call (`Ingress.status`) for the Ray hop alone; and the calling process's CPU per
bundle. At C=128 two bundles alternate on the replica, so the replica stays busy only if
a bundle's round trip, less its own batch, is shorter than the other bundle's batch.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import time
from dataclasses import replace

from benchmarks.serve.compare import deploy
from benchmarks.serve.settings import FULL, apps, configure_environment

VARIANT = "ingress+idle+inproc"  # a custom setup: engine and replica in the ingress


def _ms(samples: list[float]) -> str:
    return f"p50 {statistics.median(samples):6.2f} ms, min {min(samples):6.2f} ms"


async def probe(model_name: str, rounds: int) -> None:
    from ray import serve

    from benchmarks.serve.models import bench_models
    from deployments.ingress.client import RaybatchClient

    s = replace(FULL, setups=(VARIANT,), peers=())
    model = bench_models()[model_name]
    await asyncio.to_thread(deploy, model, s)
    handle = serve.get_app_handle(apps(s)[f"rb:{VARIANT}"][0])
    client = RaybatchClient(handle)
    x = model.payloads(1)[0]

    async def requests(n: int) -> None:
        await asyncio.gather(*(client.infer(model.name, {"INPUT0": x}) for _ in range(n)))

    for _ in range(5):
        await requests(64)
    for n in (1, 64):
        walls = []
        for _ in range(rounds):
            t = time.perf_counter()
            await requests(n)
            walls.append((time.perf_counter() - t) * 1e3)
        print(f"RaybatchClient, {n:2d} request(s) at once: {_ms(walls)}", flush=True)
    cpu, t = time.process_time(), time.perf_counter()
    for _ in range(rounds):
        await requests(64)
    print(f"caller CPU per bundle of 64: {(time.process_time() - cpu) / rounds * 1e3:.2f} ms "
          f"(wall {(time.perf_counter() - t) / rounds * 1e3:.2f} ms)", flush=True)
    hops = []
    for _ in range(rounds):
        t = time.perf_counter()
        await handle.status.remote()
        hops.append((time.perf_counter() - t) * 1e3)
    print(f"a bare handle call (Ingress.status): {_ms(hops)}", flush=True)
    print(f"the model alone: {model.name} batch of 1 and of 64, by its own cost "
          "(sleep: 2.05 and 5.2 ms)", flush=True)
    await serve.shutdown_async()  # on this loop: the handle's router lives here


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="sleep", choices=["sleep", "mlp"])
    ap.add_argument("--rounds", type=int, default=30)
    args = ap.parse_args()
    s = replace(FULL, setups=(VARIANT,), peers=())
    configure_environment(s)
    import ray
    from ray import serve

    ray.init(address="local", num_cpus=16, include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": s.port})
        asyncio.run(probe(args.model, args.rounds))
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
