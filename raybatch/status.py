"""`raybatch status`: ask the running app's ingress for each model's replicas (node, CPUs,
NUMA node, GPUs), queue depth and batch statistics (`--watch`: a live view, `raybatch.watch`).
No cluster there, or no app of that name on it, is said in a line (`StatusError`, from
`raybatch.apphandle`, which joins the cluster for both views), not a traceback.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from cluster.rayauth import add_token_file_argument
from raybatch.apphandle import app_handle
from raybatch.args import at_least, non_negative, ray_address

WATCH_MIN_INTERVAL_S = 0.1


def patient_router() -> None:
    """`status` asks the ingress once: it can give it 1 s, not Serve's 0.1 s, to say its
    queue length (set before Serve's import), and Serve's WARNING that one was slower (a
    loaded ingress) is not for the people reading its output."""
    import logging

    os.environ.setdefault("RAY_SERVE_QUEUE_LENGTH_RESPONSE_DEADLINE_S", "1.0")
    logging.getLogger("ray.serve").addFilter(
        lambda record: not record.getMessage().startswith("Failed to get queue length"))


def add_status_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--address", default="auto", type=ray_address,
                   help="Ray cluster to ask (default: auto)")
    p.add_argument("--app", default="raybatch", help="application name")
    add_token_file_argument(p)
    p.add_argument("--json", action="store_true", help="print JSON")
    p.add_argument("--watch", action="store_true",
                   help="refresh a live view per model: req/s, queue, batch fill, p50/p99 "
                        "queue wait, replicas (Ctrl-C stops)")
    # each refresh is a call to the app's ingress: at least 0.1 s apart, so that a typo
    # (1e-3, 0.0001) does not make the watch a busy loop against the cluster it watches
    p.add_argument("--interval", type=at_least(WATCH_MIN_INTERVAL_S), default=2.0,
                   metavar="S", help="seconds between refreshes of --watch, "
                   f"{WATCH_MIN_INTERVAL_S:g} or more (default: 2)")
    p.add_argument("--count", type=non_negative(int), default=0, metavar="N",
                   help="stop --watch after N frames (default: 0, never)")


def status(args: argparse.Namespace) -> int:
    patient_router()
    if args.watch:
        from raybatch.watch import run

        return run(args)
    from raybatch.nodes import fetch_annotated, ingress_lines, placement_lines

    handle = app_handle(args)
    stats = handle.status.remote().result(timeout_s=30)
    stats = fetch_annotated(stats, args.app)  # the node of each replica and actor
    if args.json:
        print(json.dumps(stats, indent=2, default=str))
        return 0
    for model, s in stats.items():
        for line in _summary(model, s):
            print(line)
        for r in s["replica_info"]:
            pinned = "in process" if r.get("in_process") else \
                "pinned" if r.get("pinned") else "unpinned"
            if r.get("read_ahead"):
                pinned += ", reads ahead"
            host = f" (host {r['node_ip']})" if r.get("node_ip") else ""
            where = (f"node {(r.get('node_id') or '?')[:8]} cpus {r.get('cpus')} "
                     f"numa {_dash(r.get('numa_node'))} {pinned} gpus {r.get('gpus')}{host}")
            ready = (f", ready in {r['ready_s']:.2f} s (setup {r.get('setup_s', 0):.2f}, "
                     f"warm-up {r.get('warmup_s', 0):.2f})" if "ready_s" in r else "")
            print(f"  replica-{r['index']}: {r['state']}, {where}, "
                  f"{r.get('outstanding_batches', 0)} outstanding{ready}")
        for line in placement_lines(s):  # the batching actors' nodes
            print(line)
    for line in ingress_lines(stats):
        print(line)
    return 0


def _summary(model: str, s: dict[str, Any]) -> list[str]:
    """Two lines on a model's queue and batches, in its engine's terms."""
    kind = s.get("kind", "dynamic")
    if kind == "iterative":
        return [f"{model}: {s['replicas']} replicas, {s['waiting']} waiting, {s['active']} "
                f"generating, {s['inflight_steps']} steps in flight",
                f"  {s['steps']} steps, {s['mean_active_per_step']} sequences per step, "
                f"{s['completed']} completed, {s['cancelled']} cancelled"]
    head = (f"{model}: {s['replicas']} replicas, queued {s['queued_requests']} requests"
            + (f" ({s['queued_items']} items)" if "queued_items" in s else "")
            + f", {s['inflight_batches']} batches in flight")
    if kind == "sequence":
        head += f", {s['live_sequences']} live sequences"
    return [head, f"  {s['batches']} batches, mean size {s.get('mean_batch_size')}, "
                  f"sent because {s['by_reason']}"]


def _dash(value: Any) -> str:
    return "-" if value is None else str(value)
