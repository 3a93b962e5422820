"""What the Serve comparison runs: its settings, the peers, and the Raybatch setups.

A Raybatch app in the comparison is one of a few named, documented setups, or a one-off
experiment spelled out option by option:

    default  the product default (deployments/configs/demo.yaml): the engine and the model
             replica in the ingress process (`batcher.placement: ingress`,
             `replicas.in_process`), `idle_dispatch`, Raybatch's own HTTP server
             (`ingress.native_port`, which the HTTP points then target)
    gpu      the GPU setup (deployments/configs/gpu.yaml's GPU models): replica actors
             that read their next batch while one runs (`replicas.read_ahead`),
             `fill_while_busy`; engine in the ingress, idle dispatch, own HTTP server
    actor    the batching-actor setup: one batching actor per model
             (`batcher.placement: actor`) holding the engine and its in-process replica,
             idle dispatch; what `RaybatchClient` talks to directly

    --custom PLACEMENT[+OPTION...]   one-off: `actor` or `ingress`, then any of OPTIONS

Each app is named after its setup (`rb:default`, `rb:ingress+idle+fill`, ...).
Serve's switches are read when `ray.serve` is imported, so `configure_environment`
runs before that.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from benchmarks.serve.report import LATENCY_C, SLEEP_C

SETUPS: dict[str, tuple[str, str]] = {
    "default": ("actor+idle+native", "the product default (demo.yaml): a batching actor "
                                     "and replica actors"),
    "inproc": ("ingress+idle+inproc+native", "the in-process shortcut: engine and replica in "
                                             "the ingress"),
    "gpu": ("ingress+idle+native+fill+ahead", "the GPU setup (gpu.yaml): replica actors "
                                              "reading ahead, fill_while_busy"),
    "actor": ("actor+idle+inproc", "the batching-actor setup (batcher.placement: actor)"),
}
PLACEMENTS = ("actor", "ingress")
OPTIONS: dict[str, str] = {
    "idle": "batching.idle_dispatch",
    "inproc": "replicas.in_process (the replica in the engine's process)",
    "native": "ingress.native_port (Raybatch's own HTTP server; HTTP points target it)",
    "fill": "batching.fill_while_busy",
    "leadN": "batching.busy_lead_s of N ms (with fill)",
    "ahead": "replicas.read_ahead (replica actors read their next batch while one runs)",
    "pipe1": "replicas.max_inflight_batches: 1",
    "access": "Serve's access log, at INFO",
    "raycall": "batcher.link and replicas.link false (a Ray call per bundle and per batch)",
}

PEERS = {"serve": ("serve-plain", "/plain"), "serve.batch": ("serve-batch", "/batched"),
         # @serve.batch with Serve's documented JSON (stdlib), for context; not a default
         "serve.batch.stdjson": ("serve-batch-stdjson", "/batched-stdjson")}
PEER_APPS = {"serve": "Plain", "serve.batch": "Batched", "serve.batch.stdjson": "BatchedStdJson"}
FRONTS = ("direct", "proxy", "haproxy")


def spec_of(setup: str) -> str:
    """The options of a setup: a named one's, or a custom spec checked option by option."""
    if setup in SETUPS:
        return SETUPS[setup][0]
    placement, *options = setup.split("+")
    if placement not in PLACEMENTS:
        raise ValueError(f"setup {setup!r}: a named setup ({', '.join(SETUPS)}) or a custom "
                         f"one starting with {' or '.join(PLACEMENTS)}")
    for option in options:
        known = option in OPTIONS or (option.startswith("lead")
                                      and option.removeprefix("lead").isdigit())
        if not known:
            raise ValueError(f"setup {setup!r}: unknown option {option!r}; options: "
                             f"{', '.join(OPTIONS)}")
    return setup


@dataclass(frozen=True, slots=True)
class Settings:
    warmup_s: float
    duration_s: float
    ceiling_s: float
    concurrencies: tuple[int, ...] | None = None  # None: CONCURRENCIES + each target's C
    paths: tuple[str, ...] = ("handle", "http")
    port: int = 8100
    ingress: str = "direct"
    binary_http: bool = True
    probes: bool = False
    isolate: bool = False  # keep all but the model replicas off the model's core
    quick: bool = False
    setups: tuple[str, ...] = ("default",)  # named setups or custom specs (`spec_of`)
    peers: tuple[str, ...] = ("serve", "serve.batch")
    http_driver: str = "wrk"
    disconnect_watch: bool = True  # False: clients send x-request-disconnect-disabled: ?1
    throughput_optimized: bool = True


FULL = Settings(warmup_s=1.0, duration_s=3.0, ceiling_s=1.0)
QUICK = Settings(warmup_s=0.5, duration_s=1.0, ceiling_s=0.5,
                 concurrencies=(LATENCY_C, SLEEP_C), quick=True)


def native_port(s: Settings, system: str) -> int | None:
    """The port of Raybatch's own HTTP server for a setup with `native`, else None."""
    if not system.startswith("rb:"):
        return None
    setup = system.removeprefix("rb:")
    if "native" not in spec_of(setup).split("+"):
        return None
    return s.port + 80 + s.setups.index(setup)


def apps(s: Settings) -> dict[str, tuple[str, str]]:
    """system -> (Serve app name, route prefix): the peers, then one app per setup."""
    out = {k: v for k, v in PEERS.items() if k in s.peers}
    for setup in s.setups:
        slug = "rb-" + setup.replace("+", "-")
        out[f"rb:{setup}"] = (slug, "/" + slug)
    return out


def configure_environment(s: Settings) -> None:
    """Serve's switches, read when `ray.serve` is imported: set them before that."""
    os.environ["RAY_SERVE_THROUGHPUT_OPTIMIZED"] = "1" if s.throughput_optimized else "0"
    os.environ["RAY_SERVE_ENABLE_DIRECT_INGRESS"] = "0" if s.ingress == "proxy" else "1"
    if s.ingress == "haproxy":
        os.environ["RAY_SERVE_ENABLE_HA_PROXY"] = "1"
    # Direct-ingress replicas take ports from these ranges: keep them beside the proxy's.
    for proto, lo in (("HTTP", 10), ("GRPC", 40)):
        os.environ.setdefault(f"RAY_SERVE_DIRECT_INGRESS_MIN_{proto}_PORT", str(s.port + lo))
        os.environ.setdefault(f"RAY_SERVE_DIRECT_INGRESS_MAX_{proto}_PORT", str(s.port + lo + 30))
    # Deleting an app would otherwise hold its direct-ingress replicas 30 s for a load
    # balancer to notice: there is none here.
    os.environ.setdefault("RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S", "0")
    os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch loads, here and in workers
