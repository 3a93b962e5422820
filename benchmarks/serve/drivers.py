"""How the comparison drives each system, and what it reads back.

Every system is driven by `benchmarks.common.loadgen.run_closed_loop` from one asyncio
loop in this process: Serve handles (`handle.infer.remote`, awaited), Raybatch's
`RaybatchClient`, and HTTP through one `aiohttp` session per point whose
connector holds C keep-alive connections. HTTP bodies are built once per
payload before the run, so the client pays for sending, not for encoding.

Batch counts come from the systems themselves (Serve baselines: `stats()`,
Raybatch: `status()`), through their handles. Handle calls must be awaited on
this loop (`RAY_SERVE_THROUGHPUT_OPTIMIZED` runs the router on the caller's
loop), while `run_closed_loop` reads its stats synchronously at the window's
edges; so a poller keeps the latest counts (at most `every_s` old, at both
edges alike) and each read also records the CPU time of every Ray process
(this process's descendants) at that instant.
"""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

import aiohttp
import numpy as np

from benchmarks.common.loadgen import processes
from deployments.protocol.binary import INFER_HEADER_LENGTH, encode_binary
from deployments.protocol.datatypes import datatype_of

Fetch = Callable[[], Awaitable[dict[str, Any]]]


# -- HTTP -------------------------------------------------------------------------------------
def http_body(x: np.ndarray, binary: bool) -> tuple[bytes, dict[str, str]]:
    """An OIP infer request for one input `INPUT0` = `x`: binary tensors both ways, or JSON."""
    entry: dict[str, Any] = {"name": "INPUT0", "datatype": datatype_of(x), "shape": list(x.shape)}
    if not binary:
        data = x.ravel().tolist()
        entry["data"] = [d.decode() if isinstance(d, bytes) else d for d in data]
        return json.dumps({"inputs": [entry]}).encode(), {"Content-Type": "application/json"}
    raw = encode_binary(x)
    entry["parameters"] = {"binary_data_size": len(raw)}
    header = json.dumps({"inputs": [entry], "parameters": {"binary_data_output": True}}).encode()
    return header + raw, {"Content-Type": "application/octet-stream",
                          INFER_HEADER_LENGTH: str(len(header))}


class HttpDriver:
    """`submit(body_and_headers)` over one keep-alive connection pool of `concurrency`."""

    def __init__(self, url: str, concurrency: int) -> None:
        self.url = url
        self.concurrency = concurrency
        self.session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> HttpDriver:
        self.session = aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=self.concurrency, ttl_dns_cache=None),
            timeout=aiohttp.ClientTimeout(total=120))
        return self

    async def __aexit__(self, *exc: Any) -> None:
        assert self.session is not None
        await self.session.close()

    async def submit(self, payload: tuple[bytes, dict[str, str]]) -> bytes:
        body, headers = payload
        assert self.session is not None
        async with self.session.post(self.url, data=body, headers=headers) as r:
            data = await r.read()
            if r.status != 200:
                raise RuntimeError(f"HTTP {r.status}: {data[:200]!r}")
            return data


async def http_url(app: str, route_prefix: str, model: str, proxy_port: int,
                   direct: bool, native_port: int | None = None) -> str:
    """The infer URL of `app`: through Serve's proxy, straight at the ingress replica's
    own port (direct ingress: what an HAProxy or a load balancer in front would target),
    or at Raybatch's own HTTP server in the replica (`native_port`, when given)."""
    path = f"{route_prefix.rstrip('/')}/v2/models/{model}/infer"
    if native_port is not None:
        return f"http://127.0.0.1:{native_port}{path}"
    if not direct:
        return f"http://127.0.0.1:{proxy_port}{path}"
    port = await direct_port(app)
    return f"http://127.0.0.1:{port}{path}"


async def direct_port(app: str, timeout_s: float = 60.0) -> int:
    """The HTTP port the ingress replica of `app` listens on (direct ingress)."""
    from ray.serve.context import _get_global_client

    controller = _get_global_client()._controller
    give_up = time.monotonic() + timeout_s
    while True:
        groups = await controller.get_target_groups.remote(app)
        ports = [t.port for g in groups if g.protocol == "HTTP" and g.app_name == app
                 for t in g.targets]
        if ports:
            return ports[0]
        if time.monotonic() > give_up:
            raise RuntimeError(f"no direct-ingress HTTP port for app {app!r}: {groups}")
        await asyncio.sleep(0.2)


# -- statistics, CPU and cores ----------------------------------------------------------------
def descendants(root: int, procs: dict[int, tuple[int, float]] | None = None) -> list[int]:
    """Every live process below `root` (for this driver: the Ray processes)."""
    procs = processes() if procs is None else procs
    out = []
    for pid in procs:
        p, seen = procs[pid][0], 0
        while p > 1 and p != root and seen < 64:
            p, seen = (procs[p][0] if p in procs else 0), seen + 1
        if p == root:
            out.append(pid)
    return out


def tree_cpu_s(root: int) -> dict[str, float]:
    """user+system CPU seconds of every live descendant of `root` (the Ray processes), by
    process title (`ray::ServeReplica:raybatch:Ingress`, `ray::BatcherActor`, ...)."""
    procs = processes()
    out: dict[str, float] = {}
    for pid in descendants(root, procs):
        name = _title(pid)
        out[name] = out.get(name, 0.0) + procs[pid][1]
    return out


def _title(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = f.read().split(b"\0")
    except OSError:
        return "?"
    first = argv[0].decode(errors="replace").split(" ")[0]
    if first.startswith("ray::"):
        return first.split(".")[0]  # `ray::BatcherActor.infer` while busy: one name
    tail = next((a for a in argv[1:3] if a.endswith((b".py", b"haproxy"))), argv[0])
    return os.path.basename(tail.decode(errors="replace")) or "?"


def isolate_core(core: int) -> int:
    """Keep this process and every Ray process off `core`, except the threads already pinned
    to it alone (the model threads): the model gets its core to itself, as a replica pinned
    to its cores would. Returns how many threads were moved."""
    others = set(range(os.cpu_count() or 1)) - {core}
    if not others:
        return 0
    moved = 0
    for pid in [os.getpid(), *descendants(os.getpid())]:
        try:
            tids = [int(t) for t in os.listdir(f"/proc/{pid}/task")]
        except OSError:
            continue
        for tid in tids:
            try:
                if os.sched_getaffinity(tid) != {core}:
                    os.sched_setaffinity(tid, others)
                    moved += 1
            except OSError:  # the thread ended meanwhile
                continue
    return moved


class StatsPoller:
    """The latest batch counts of one system, refreshed every `every_s` on this loop."""

    def __init__(self, fetch: Fetch, every_s: float = 0.1) -> None:
        self.fetch = fetch
        self.every_s = every_s
        self.latest: dict[str, Any] = {}
        self.edges: list[tuple[float, dict[str, float]]] = []  # (perf_counter, CPU s by title)
        self._task: asyncio.Task | None = None

    async def __aenter__(self) -> StatsPoller:
        self.latest = await self.fetch()
        self._task = asyncio.get_running_loop().create_task(self._poll())
        return self

    async def __aexit__(self, *exc: Any) -> None:
        assert self._task is not None
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)

    async def _poll(self) -> None:
        while True:
            await asyncio.sleep(self.every_s)
            self.latest = await self.fetch()

    def __call__(self) -> dict[str, Any]:
        """What `run_closed_loop` reads at each edge of its window."""
        self.edges.append((time.perf_counter(), tree_cpu_s(os.getpid())))
        return self.latest

    def server_cpu_s(self) -> dict[str, float] | None:
        """CPU seconds of each kind of Ray process over the window (None: no window)."""
        if len(self.edges) < 2:
            return None
        (_, a), (_, b) = self.edges[:2]
        return {k: b[k] - a.get(k, 0.0) for k in b if b[k] - a.get(k, 0.0) > 0}


# -- process groups -----------------------------------------------------------------------------
FRONTS = ("serve proxy", "haproxy")


def group_of(title: str) -> str:
    """The process group of a Ray process title: `<app>/<deployment>` for a Serve replica,
    `batcher`, `model replicas`, `serve proxy`, `haproxy`, `serve controller`, else `ray`."""
    t = title.removeprefix("ray::")
    if t.startswith("ServeReplica:"):
        _, app, deployment = [*t.split(":", 2), "?"][:3]
        return f"{app}/{deployment}"
    for prefix, group in (("BatcherActor", "batcher"), ("ModelReplica", "model replicas"),
                          ("PlainBatcher", "batcher"), ("ProxyActor", "serve proxy"),
                          ("ServeController", "serve controller"), ("haproxy", "haproxy")):
        if t.startswith(prefix):
            return group
    return "ray"


def cpu_by_group(by_title: dict[str, float]) -> dict[str, float]:
    out: dict[str, float] = {}
    for title, cpu in by_title.items():
        g = group_of(title)
        out[g] = out.get(g, 0.0) + cpu
    return out


def own_cpu_s(groups: dict[str, float], app: str, raybatch: bool) -> float:
    """CPU of the system's own processes: its ingress (or Serve replica) and, for Raybatch,
    its batching actors and model replicas (only the driven system is busy in a point)."""
    own = sum(v for g, v in groups.items() if g.startswith(f"{app}/"))
    if raybatch:
        own += groups.get("batcher", 0.0) + groups.get("model replicas", 0.0)
    return own
