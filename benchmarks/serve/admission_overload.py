"""Overload against the demo on Raybatch's own HTTP port: admission by time, measured.

Deploys deployments/configs/demo.yaml in a local Ray (its own HTTP server on
`ingress.native_port`, 8088) and, against one model (`square` by default):

1. a burst: `--burst` concurrent single-item requests at once (the statuses);
2. capacity: a closed loop of `--concurrency` clients for 5 s (answers per second);
3. overload: open loop at `--multiple` x that capacity for `--duration` s (requests sent
   at fixed times whatever comes back; a request finding every connection busy is
   counted as not sent), after a 5 s warm-up at the same rate: counts of 200 / 429 /
   other, the accepted requests' latency percentiles against the bound
   (`limits.max_queue_wait_s`) plus one batch time, the Retry-After values, and the
   resident memory of the ingress replica (it runs the engine and, in process, the
   model's replicas) before and after.

The client sends one pre-encoded body on keep-alive connections: raw asyncio streams for
the burst and the capacity, and for the open loop a protocol per connection (no task or
stream per request), on uvloop: aiohttp costs as much CPU per request as the server on
these 2 cores, so it could not offer the load, and the client's own lag counts in every
latency it measures. Latencies are from when a request was due to be sent (an open
loop's measure: a late send counts), and, beside them, from when its write returned.
Where the client still cannot offer `--multiple` x capacity, the figures
say what it did offer. Hold the machine's Ray lock:

    flock /tmp/raybatch-ray.lock timeout 300 .venv/bin/python \\
        -m benchmarks.serve.admission_overload --out benchmarks/results/DATE-admission-overload
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import time
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "deployments" / "configs" / "demo.yaml"


# -- the client ----------------------------------------------------------------------------
def request_bytes(port: int, model: str, width: int, items: int = 1,
                  binary: bool = False) -> bytes:
    """One infer request of `items` items (each `width` FP32 values), JSON or with the
    binary tensor extension (inputs and outputs), as bytes ready to send."""
    shape = [items] if width == 1 else [items, width]
    x = np.full(items * width, 0.5, np.float32)
    if binary:
        raw = x.tobytes()
        head = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": shape,
                                       "parameters": {"binary_data_size": len(raw)}}],
                           "outputs": [{"name": "OUTPUT0",
                                        "parameters": {"binary_data": True}}]}).encode()
        body, kind = head + raw, ("application/octet-stream\r\nInference-Header-Content-"
                                  f"Length: {len(head)}")
    else:
        body = json.dumps({"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": shape,
                                       "data": x.tolist()}]}).encode()
        kind = "application/json"
    head = (f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            f"Content-Type: {kind}\r\nContent-Length: {len(body)}\r\n\r\n")
    return head.encode() + body


class Conn:
    """One keep-alive connection: send the request, read one response."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.reader, self.writer = reader, writer

    async def call(self, data: bytes) -> int:
        """The response's status."""
        self.writer.write(data)
        head = (await self.reader.readuntil(b"\r\n\r\n"))[:-4].lower()
        await self.reader.readexactly(int(_field(head, b"content-length") or 0))
        return int(head[9:12])


async def connect(port: int, n: int) -> list[Conn]:
    out = []
    for _ in range(n):
        out.append(Conn(*await asyncio.open_connection("127.0.0.1", port)))
    return out


async def burst(port: int, data: bytes, n: int) -> Counter:
    conns = await connect(port, n)
    results = await asyncio.gather(*(c.call(data) for c in conns), return_exceptions=True)
    for c in conns:
        c.writer.close()
    return Counter(r if isinstance(r, int) else type(r).__name__ for r in results)


async def closed_loop(port: int, data: bytes, clients: int, seconds: float) -> float:
    """Answers (200) per second with `clients` each sending its next at once."""
    conns = await connect(port, clients)
    ok, end = 0, time.monotonic() + seconds

    async def client(c: Conn) -> None:
        nonlocal ok
        while time.monotonic() < end:
            status = await c.call(data)
            ok += status == 200

    start = time.monotonic()
    await asyncio.gather(*(client(c) for c in conns))
    rate = ok / (time.monotonic() - start)
    for c in conns:
        c.writer.close()
    return rate


class Caller(asyncio.Protocol):
    """One keep-alive connection of the open loop, as a protocol: a request goes out with
    one `write`, its response is framed from the bytes as they arrive (status line and
    Content-Length), timed when its last byte is read. No task, stream or coroutine per
    request: the client shares the 2 cores with the server, and its own lag counts in
    every latency it measures."""

    def __init__(self, loop_state: OpenLoop) -> None:
        self.state = loop_state
        self.transport: Any = None
        self.buf = bytearray()
        self.due_s = self.sent_s = 0.0

    def connection_made(self, transport: Any) -> None:
        self.transport = transport

    def send(self, data: bytes, due_s: float) -> None:
        self.due_s = due_s
        self.transport.write(data)
        self.sent_s = time.monotonic()

    def data_received(self, data: bytes) -> None:
        buf = self.buf
        buf += data
        end = buf.find(b"\r\n\r\n")
        if end < 0:
            return
        head = bytes(buf[:end]).lower()
        length = _field(head, b"content-length")
        if len(buf) < end + 4 + int(length or 0):
            return
        del buf[:end + 4 + int(length or 0)]
        status = int(head[9:12])
        retry = _field(head, b"retry-after")
        self.state.answered(self, status, retry, time.monotonic())

    def connection_lost(self, exc: Exception | None) -> None:
        self.state.lost(self, exc)


def _field(head: bytes, name: bytes) -> str | None:
    """A header's value in a lowercased response head, None if it has none."""
    at = head.find(b"\r\n" + name + b":")
    if at < 0:
        return None
    stop = head.find(b"\r\n", at + 2)
    return head[at + len(name) + 3:stop if stop >= 0 else len(head)].strip().decode()


class OpenLoop:
    """What the open loop counts, and its idle connections."""

    def __init__(self, conns: list[Caller]) -> None:
        self.idle = list(conns)
        self.busy: set[Caller] = set()
        self.statuses: Counter = Counter()
        self.latencies: list[float] = []  # from when it was due to be sent
        self.from_write: list[float] = []  # from when the client's write returned
        self.retry_after: Counter = Counter()

    def answered(self, c: Caller, status: int, retry: str | None, now: float) -> None:
        self.busy.discard(c)
        self.statuses[status] += 1
        if status == 200:
            self.latencies.append(now - c.due_s)
            self.from_write.append(now - c.sent_s)
        elif retry is not None:
            self.retry_after[retry] += 1
        self.idle.append(c)

    def lost(self, c: Caller, exc: Exception | None) -> None:
        if c in self.busy:  # a connection closed under a request: counted, not reused
            self.busy.discard(c)
            self.statuses[type(exc).__name__ if exc else "closed"] += 1
        if c in self.idle:
            self.idle.remove(c)


async def open_callers(port: int, n: int, state_box: list) -> list[Caller]:
    loop = asyncio.get_running_loop()
    out = []
    for _ in range(n):
        _, proto = await loop.create_connection(lambda: Caller(state_box[0]),
                                                "127.0.0.1", port)
        out.append(proto)
    return out


def _quantiles(xs: list[float]) -> dict[str, float]:
    lat = np.array(xs) if xs else np.zeros(1)
    return {q: round(float(np.percentile(lat, p)), 4) for q, p in
            (("p50", 50), ("p90", 90), ("p99", 99), ("max", 100))}


async def open_loop(data: bytes, rate: float, seconds: float,
                    conns: list[Caller]) -> dict[str, Any]:
    """Send at `rate`/s for `seconds` (what is due, every half millisecond), each on an
    idle connection; what came back."""
    state = OpenLoop(conns)
    for c in conns:
        c.state = state
    not_sent = 0
    n = int(rate * seconds)
    start = time.monotonic()
    i = 0
    while i < n:
        now = time.monotonic()
        due_n = min(n, int((now - start) * rate) + 1)
        while i < due_n:
            due = start + i / rate
            i += 1
            if not state.idle:
                not_sent += 1
                continue
            c = state.idle.pop()
            state.busy.add(c)
            c.send(data, due)
        await asyncio.sleep(0.0005)
    sent_for_s = time.monotonic() - start
    end = time.monotonic() + 60
    while state.busy and time.monotonic() < end:
        await asyncio.sleep(0.01)
    return {"offered_per_s": rate, "seconds": seconds, "sending_took_s": round(sent_for_s, 2),
            "sent": n - not_sent, "not_sent_no_idle_connection": not_sent,
            "unanswered": len(state.busy),
            "statuses": {str(k): v for k, v in sorted(state.statuses.items(), key=str)},
            "accepted_per_s": round(len(state.latencies) / seconds, 1),
            "accepted_latency_s": _quantiles(state.latencies),
            "accepted_latency_from_write_s": _quantiles(state.from_write),
            "retry_after": dict(state.retry_after)}


# -- the server side -----------------------------------------------------------------------
def rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        line = next(x for x in f if x.startswith("VmRSS:"))
    return round(int(line.split()[1]) / 1024, 1)


def ingress_pid(app_name: str) -> int:
    from ray._private.state import actors

    pids = [a["Pid"] for a in actors().values() if a["State"] == "ALIVE" and a["Pid"]
            and a["Name"].startswith(f"SERVE_REPLICA::{app_name}#")
            and "Ingress" in a["Name"]]
    if len(pids) != 1:
        raise SystemExit(f"expected one ingress replica of {app_name}, found {pids}")
    return pids[0]


def deploy(config_path: Path, models: set[str]) -> tuple[Any, Any]:
    """The config's app with only `models` (every one if empty), in a local Ray."""
    import ray
    import yaml
    from ray import serve

    from cluster.config import load_config
    from deployments.app import build_app
    from deployments.http import FAST_PATH_ENV
    from raybatch.serving import grpc_options
    from tests.conftest import free_port

    os.environ.update(FAST_PATH_ENV)
    os.environ.setdefault("RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S", "0")
    os.chdir(ROOT)
    ray.init(address="local", num_cpus=4, include_dashboard=False, log_to_driver=False)
    serve.start(http_options={"host": "127.0.0.1", "port": free_port()},
                grpc_options=grpc_options(free_port()))
    data = yaml.safe_load(config_path.read_text())
    if models:
        data["models"] = [m for m in data["models"] if m["name"] in models]
    config = load_config(data)
    handle = serve.run(build_app(config), name=config.app_name,
                       route_prefix=config.ingress.route_prefix)
    return config, handle


async def poll(handle: Any, model: str, timeline: list[dict[str, Any]]) -> None:
    """Every second: what the engine holds and what it predicts a full batch adds."""
    start = time.monotonic()
    while True:
        await asyncio.sleep(1.0)
        s = (await handle.status.remote())[model]
        adm = s.get("admission") or {}
        timeline.append({"t": round(time.monotonic() - start, 1),
                         "queued_requests": s.get("queued_requests"),
                         "inflight_batches": s.get("inflight_batches"),
                         "batch_share_ms": round(adm.get("batch_share_ms", 0.0), 2)})


def engine_waits(before: dict[str, Any], after: dict[str, Any]) -> dict[str, Any]:
    """Quantiles of the accepted requests' wait in the engine's queue between two stats
    snapshots (its histogram): the part of their latency that admission predicts."""
    from batching.stats import LATENCY_BUCKETS_S, quantile

    counts = [b - a for a, b in zip(before["queue_hist"], after["queue_hist"])]
    return {"p50": quantile(0.5, counts), "p99": quantile(0.99, counts),
            "above_last_bound": counts[-1], "le_1s": sum(
                n for n, le in zip(counts, LATENCY_BUCKETS_S) if le <= 1.0),
            "count": sum(counts)}


async def measure(args: argparse.Namespace, config: Any, handle: Any) -> dict[str, Any]:
    port = config.ingress.native_port
    model = next(m for m in config.models if m.name == args.model)
    width = 1 if len(model.inputs[0].shape) == 1 else model.inputs[0].shape[-1]
    data = request_bytes(port, args.model, width, args.items, args.binary)
    pid = ingress_pid(config.app_name)
    out: dict[str, Any] = {"model": args.model, "port": port, "items_per_request": args.items,
                           "binary": args.binary,
                           "max_queue_wait_s": model.limits.max_queue_wait_s,
                           "max_batch_size": model.batch_size,
                           "replicas": model.replicas.max_replicas}
    out["burst"] = {"requests": args.burst,
                    "statuses": dict(await burst(port, data, args.burst))}
    capacity = await closed_loop(port, data, args.concurrency, 5.0)
    out["capacity_per_s"] = round(capacity, 1)
    rate = args.multiple * capacity
    conns = await open_callers(port, args.connections, [OpenLoop([])])
    out["warmup"] = await open_loop(data, rate, 5.0, conns)
    await asyncio.sleep(2)
    rss_before = rss_mib(pid)
    before = (await handle.status.remote())[args.model]
    timeline: list[dict[str, Any]] = []
    poller = asyncio.create_task(poll(handle, args.model, timeline))
    out["overload"] = await open_loop(data, rate, args.duration, conns)
    poller.cancel()
    out["overload"]["engine_timeline"] = timeline
    stats = (await handle.status.remote())[args.model]
    out["overload"]["engine_queue_wait_s"] = engine_waits(before, stats)
    await asyncio.sleep(2)
    out["rss_mib"] = {"before": rss_before, "after": rss_mib(pid)}
    out["rss_mib"]["change"] = round(out["rss_mib"]["after"] - rss_before, 1)
    adm = stats.get("admission") or {}
    share_ms = adm.get("batch_share_ms", 0.0)
    batch_s = share_ms * model.replicas.max_replicas / 1e3  # one batch on one replica
    out["engine"] = {"admission": adm, "latency_model": stats.get("latency_model"),
                     "mean_batch_size": stats.get("mean_batch_size")}
    bound = (model.limits.max_queue_wait_s or 0.0) + batch_s
    out["target"] = {"bound_plus_one_batch_s": round(bound, 4),
                     "accepted_p99_s": out["overload"]["accepted_latency_s"]["p99"],
                     "only_200_and_429": set(out["overload"]["statuses"]) <= {"200", "429"},
                     "memory_flat_32mib": abs(out["rss_mib"]["change"]) <= 32}
    for c in conns:
        c.transport.close()
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", type=Path, default=DEMO)
    p.add_argument("--model", default="square")
    p.add_argument("--burst", type=int, default=1500)
    p.add_argument("--items", type=int, default=1, help="items per request")
    p.add_argument("--binary", action="store_true", help="binary tensors, not JSON")
    p.add_argument("--concurrency", type=int, default=64, help="closed-loop clients")
    p.add_argument("--multiple", type=float, default=10.0, help="offered / capacity")
    p.add_argument("--duration", type=float, default=30.0)
    p.add_argument("--connections", type=int, default=1900,
                   help="open-loop connections (the server serves 2048 at once)")
    p.add_argument("--all-models", action="store_true",
                   help="deploy every model of the config (default: only --model)")
    p.add_argument("--out", type=Path, default=None, help="folder for overload_<model>.json")
    args = p.parse_args()
    from ray import serve

    config, handle = deploy(args.config, set() if args.all_models else {args.model})
    try:
        # uvloop: the client shares the 2 cores with the server, and its own lag (a late
        # send, a late read) is counted in every latency it measures.
        import uvloop
        with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
            result = runner.run(measure(args, config, handle))
    finally:
        serve.shutdown()
    text = json.dumps(result, indent=1)
    print(text)
    if args.out:
        args.out.mkdir(parents=True, exist_ok=True)
        name = f"overload_{args.model}_{args.items}items{'_binary' if args.binary else ''}"
        (args.out / f"{name}.json").write_text(text + "\n")


if __name__ == "__main__":
    main()
