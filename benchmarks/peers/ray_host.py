"""Ray Serve's `@serve.batch` peer in a process of its own, for `benchmarks.peers`.

    python -m benchmarks.peers.ray_host --port P --ready-file F

Starts a local Ray and Serve with the settings `benchmarks.serve.compare` gives Serve
(`configure_environment`: throughput-optimized, direct ingress), deploys
`benchmarks.serve.apps.Batched` for the mlp (max batch 64, 2 ms, one replica), writes
`{"url": <infer URL>}` to F once it answers, then reads commands on stdin: `stats`
writes the replica's batch counts as JSON to F's sibling `serve-batch.stats`, `quit`
(or end of input) shuts Serve and Ray down. Nothing is read from the replica while
load runs, so this driver adds no CPU to the measured window but its idle loop.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--port", type=int, required=True, help="Serve's HTTP port")
    ap.add_argument("--ready-file", type=Path, required=True)
    args = ap.parse_args(argv)

    from benchmarks.serve.settings import FULL, configure_environment

    configure_environment(replace(FULL, port=args.port))
    import ray
    from ray import serve

    from benchmarks.serve import apps as serve_apps
    from benchmarks.serve.drivers import http_url
    from benchmarks.serve.models import bench_models

    model = bench_models()["mlp"]
    ray.init(address="local", num_cpus=16, include_dashboard=False, log_to_driver=False)
    try:
        serve.start(http_options={"host": "127.0.0.1", "port": args.port})
        app = serve_apps.serve_app(serve_apps.Batched, model)
        serve.run(app, name="serve-batch", route_prefix="/batched")
        asyncio.run(serve_commands(args.port, args.ready_file, http_url))
    finally:
        ray.shutdown()


async def serve_commands(port: int, ready_file: Path, http_url: Any) -> None:
    """Announce the URL, then answer `stats` until `quit` (Serve's throughput-optimized
    handles are called from an event loop)."""
    from ray import serve

    try:
        handle = serve.get_app_handle("serve-batch")
        url = await http_url("serve-batch", "/batched", "mlp", port, True)
        tmp = ready_file.with_suffix(".tmp")
        tmp.write_text(json.dumps({"url": url}))
        tmp.replace(ready_file)
        stats_path = ready_file.parent / "serve-batch.stats"
        while True:
            cmd = (await asyncio.to_thread(sys.stdin.readline)).strip()
            if cmd in ("quit", ""):
                break
            if cmd == "stats":
                s = await handle.stats.remote()
                tmp = stats_path.with_suffix(".tmp")
                tmp.write_text(json.dumps(s))
                tmp.replace(stats_path)
    finally:
        # Handles' long-poll clients live on this loop: silence them while Serve goes away.
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: None)
        await serve.shutdown_async()

if __name__ == "__main__":
    main()
