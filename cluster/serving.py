"""`raybatch up` and `raybatch status`: bring the app up on Ray, and look at it.

`up` starts a local Ray in this process (the embedded default) or joins one
(`--address`), deploys the app from the config, prints the URLs and an example
request, and runs until Ctrl-C; then it deletes the app, which stops every
batching and replica actor. `status` asks the running app's ingress for each
model's replicas, queue depth and batch statistics.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
from typing import Any


def add_up_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", help="YAML config (default: the bundled demo)")
    p.add_argument("--address", help="join this Ray cluster instead of starting a local one")
    p.add_argument("--host", help="HTTP host (default: the config's ingress.host)")
    p.add_argument("--port", type=int, help="HTTP port (default: the config's ingress.port)")
    p.add_argument("--num-cpus", type=int, help="CPUs of the local Ray (default: all)")
    p.add_argument("--exit-after-deploy", action="store_true",
                   help="deploy, print, and exit (for scripts and tests)")


def up(args: argparse.Namespace) -> int:
    import ray
    from ray import serve

    from cluster.config import load_default
    from deployments.app import build_app

    config = load_default(args.config)
    ingress = config.ingress
    host, port = args.host or ingress.host, args.port or ingress.port
    ray.init(address=args.address, num_cpus=args.num_cpus, include_dashboard=False,
             runtime_env={"env_vars": {"RAY_SERVE_THROUGHPUT_OPTIMIZED":
                                       os.environ.get("RAY_SERVE_THROUGHPUT_OPTIMIZED", "0")}})
    serve.start(http_options={"host": host, "port": port})
    print(f"deploying {len(config.models)} models: {', '.join(m.name for m in config.models)}",
          flush=True)
    serve.run(build_app(config), name=config.app_name, route_prefix=ingress.route_prefix)
    _print_welcome(config, host, port)
    if args.exit_after_deploy:
        return 0
    stop = threading.Event()
    signal.signal(signal.SIGINT, lambda *_: stop.set())
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    stop.wait()
    print("\nshutting down: deleting the app and its actors", flush=True)
    serve.delete(config.app_name)
    serve.shutdown()
    ray.shutdown()
    return 0


def _print_welcome(config: Any, host: str, port: int) -> None:
    base = f"http://{host}:{port}{config.ingress.route_prefix.rstrip('/')}"
    first = config.models[0]
    tensor = first.inputs[0]
    shape = [1, *[d if d > 0 else 1 for d in tensor.shape[1:]]]
    n = 1
    for d in shape:
        n *= d
    body = json.dumps({"inputs": [{"name": tensor.name, "datatype": tensor.datatype,
                                   "shape": shape, "data": [1.0] * n}]})
    print(f"\nRaybatch is serving at {base}", flush=True)
    for m in config.models:
        print(f"  {m.name:10s} {base}/v2/models/{m.name}/infer")
    print(f"\nTry:\n  curl -s {base}/v2/models/{first.name}/infer -d '{body}'")
    print("  raybatch status\nStop with Ctrl-C.", flush=True)


def add_status_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--address", default="auto", help="Ray cluster to ask (default: auto)")
    p.add_argument("--app", default="raybatch", help="application name")
    p.add_argument("--json", action="store_true", help="print JSON")


def status(args: argparse.Namespace) -> int:
    import ray
    from ray import serve

    ray.init(address=args.address, log_to_driver=False)
    stats = serve.get_app_handle(args.app).status.remote().result(timeout_s=30)
    if args.json:
        print(json.dumps(stats, indent=2, default=str))
        return 0
    for model, s in stats.items():
        print(f"{model}: {s['replicas']} replicas, queued {s['queued_requests']} requests "
              f"({s['queued_items']} items), {s['inflight_batches']} batches in flight")
        print(f"  {s['batches']} batches, mean size {s['mean_batch_size']}, "
              f"sent because {s['by_reason']}")
        for r in s["replica_info"]:
            where = f"node {r.get('node_id', '?')[:8]} cpus {r.get('cpus')} gpus {r.get('gpus')}"
            print(f"  replica-{r['index']}: {r['state']}, {where}, "
                  f"{r.get('outstanding_batches', 0)} outstanding")
    return 0
