"""Application-wide settings: the ingress (ports, request limits, drain, Serve's
logging and HAProxy switch) and metrics; and what the ingress's replica count allows
(a stateful model's engine in the ingress needs exactly one: `stateful_in_one_ingress`).

Part of the config (`cluster.config` re-exports them); one place for what is set once
per app rather than per model.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from cluster.spread import LabelSelector, Resources


class IngressConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    num_replicas: int = Field(default=1, ge=1)
    """Serve replicas of the HTTP/handle ingress."""
    num_cpus: float = Field(default=0.5, ge=0)
    """CPUs each ingress replica reserves, besides what its in-process engines' replicas reserve."""
    resources: Resources = Field(default_factory=dict)
    """Ray custom resources each ingress replica asks for (Serve's `ray_actor_options`), so
    that only nodes advertising them run one, e.g. {"front": 0.001} on the hosts clients
    reach. On Kubernetes no rendered pod advertises custom resources: leave it empty."""
    labels: LabelSelector = Field(default_factory=dict)
    """Ray node labels an ingress replica's node must match (Serve's `ray_actor_options`
    `label_selector`; as `replicas.labels`), e.g. {"role": "front"}."""
    max_body_bytes: int = Field(default=64 * 2**20, ge=1024)
    """Largest request body accepted; larger ones get HTTP 413, as soon as the body
    passes it (the rest is not read)."""
    body_timeout_s: float = Field(default=30.0, gt=0)
    """Longest wait for the next piece of a request body; a body that stalls longer
    gets HTTP 408."""
    max_header_count: int = Field(default=100, ge=8)
    """Most request headers; more get HTTP 431."""
    max_header_bytes: int = Field(default=16 * 2**10, ge=1024)
    """Most bytes of request headers, names and values; more get HTTP 431."""
    max_items_per_request: int = Field(default=65_536, ge=1)
    """Most items (the leading, batch dim) in one infer request; more get HTTP 413."""
    max_elements_per_request: int = Field(default=2**26, ge=1)
    """Most tensor elements (the inputs' shape products, summed) in one infer request,
    checked from the shapes before anything is allocated; more get HTTP 413."""
    max_streams_per_client: int = Field(default=16, ge=1)
    """Most generate_stream (SSE) responses one client address holds open at once;
    more get HTTP 429 with Retry-After."""
    max_inflight_requests: int = Field(default=2048, ge=1)
    """Most HTTP requests one ingress replica serves at once; more get HTTP 503 with
    Retry-After. It bounds the fast path too, where Serve's max_ongoing_requests does
    not look."""
    route_prefix: str = "/"
    """URL prefix of the app's HTTP routes in Serve."""
    server_name: str = Field(default="raybatch", min_length=1, max_length=64)
    """The server's name in `GET /v2` and gRPC `ServerMetadata`; `triton` for clients that
    check they talk to Triton (Triton's example programs do)."""
    host: str = "127.0.0.1"
    """Address Serve's HTTP front listens on (the Kubernetes rendering sets `0.0.0.0`)."""
    port: int = Field(default=8000, ge=1, le=65535)
    """Serve's HTTP front (HAProxy, or Serve's proxy, in front of the replicas)."""
    native_port: int | None = Field(default=None, ge=1, le=65535)
    """Port of Raybatch's own HTTP/1.1 server (`deployments.http.pyserver.server`), started in
    every ingress replica beside Serve's front; the replicas of a node share it
    (SO_REUSEPORT), on `host`. Same routes, limits and errors as `port`, with about a
    third less CPU per request than uvicorn under Serve; it bypasses Serve's proxy and
    HAProxy (the kernel spreads connections across a node's replicas). None: Serve's
    front only."""
    native_front: bool = True
    """Own HTTP server: its sockets on a native thread (`deployments.http.native.front`), and the
    binary infer requests it has answered before queued there and handed to the engine in
    blocks, with Python entered per block, not per request. False (or where the C part was
    not compiled): the Python server alone. Same answers and errors either way."""
    keep_alive_s: float = Field(default=75.0, gt=0)
    """Own HTTP server: a connection with no request under way for this long is closed."""
    header_timeout_s: float = Field(default=10.0, gt=0)
    """Own HTTP server: longest time from a request head's first byte to its last; a
    slower head (a slowloris client) gets HTTP 408 and the connection closes."""
    max_connections: int = Field(default=10_000, ge=1)
    """Own HTTP server: most open connections per ingress replica; past it the one idle
    longest (between requests, or still sending a head) is closed to make room, or the
    new one gets HTTP 503 when every connection has a request under way."""
    max_unsent_bytes: int = Field(default=2**20, ge=4096)
    """Own HTTP server: bytes of answers waiting for a client to read them, past which
    that connection is not read (nor its pipelined requests started) until it drains."""
    max_pipelined_requests: int = Field(default=16, ge=1)
    """Own HTTP server: requests of one connection parsed ahead of the one being
    answered; past it the connection is not read until answers go out."""
    default_timeout_s: float | None = Field(default=None, gt=0)
    """Deadline of a request that names none; None: no deadline."""
    grpc_port: int | None = Field(default=9000, ge=1, le=65535)
    """Port of the KServe v2 / Triton gRPC service (Serve's gRPC proxy); None: no gRPC."""
    drain_timeout_s: float = Field(default=15.0, gt=0)
    """On delete or redeploy: how long the batching actors may take to finish the requests
    they accepted (new ones get 503) before what is left fails with 503."""
    stop_timeout_s: float = Field(default=10.0, gt=0)
    """A local `raybatch up`, after Ctrl-C: the longest it waits for the requests in flight
    to finish before it ends its processes anyway (a second Ctrl-C ends them at once). On a
    cluster (`--address`, Kubernetes) Serve's own draining applies instead (README)."""
    log_level: Literal["DEBUG", "INFO", "WARNING", "ERROR", "CRITICAL"] = "WARNING"
    """Log level of the app's Serve deployments. Below INFO, Serve skips the access-log
    record it otherwise builds for every request, even with `access_log: false`."""
    access_log: bool = False
    """Serve's access log, one line per request (it then logs at INFO at least)."""
    haproxy: bool = True
    """`raybatch up` starts Ray with Serve's HAProxy on the HTTP port, in front of the
    ingress replicas' own ports (`RAY_SERVE_ENABLE_HA_PROXY=1`); False: Serve's proxy.
    HAProxy binds the replicas' ports on all interfaces. See `cluster.render.serve_environment`."""

    @model_validator(mode="after")
    def _ports_differ(self) -> IngressConfig:
        if self.native_port is not None and self.native_port in (self.port, self.grpc_port):
            raise ValueError(f"ingress.native_port={self.native_port} is also Serve's "
                             f"{'HTTP' if self.native_port == self.port else 'gRPC'} port; "
                             "give Raybatch's own HTTP server a port of its own")
        return self


class MetricsConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    enabled: bool = True
    """Record the raybatch_* series with ray.util.metrics (exported by every Ray node on
    its metrics port as ray_raybatch_*); false records nothing."""
    interval_s: float = Field(default=1.0, gt=0, le=60)
    """How often each batching actor samples its queue depths, replicas and counts. Ray
    itself exports every metrics_report_interval_ms (10 s by default)."""


def stateful_in_one_ingress(ingress: IngressConfig, models: Sequence[str]) -> None:
    """`models`: the stateful ones whose engine runs in the ingress (`batcher.placement:
    ingress`). A sequence's state lives in the engine that started it, so they need one
    ingress replica: with more, Serve could send a sequence's next request to another."""
    n = ingress.num_replicas
    if models and n != 1:
        raise ValueError(
            f"models {list(models)} are stateful (batching.kind='sequence') with "
            f"batcher.placement='ingress', and ingress.num_replicas={n}: Serve may send a "
            "sequence's requests to different ingress replicas, each with its own engine, so "
            "they would not find their sequence; set ingress.num_replicas to 1, or "
            "batcher.placement to 'actor' for those models")
