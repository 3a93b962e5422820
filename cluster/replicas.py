"""A model's replicas as the config describes them: how many, what each reserves, where
it runs (an actor of its own, pinned or not, or in its engine's process); and where its
engine runs (`BatcherConfig`: the ingress, or batching actors).

Split from `cluster.config`, which re-exports both: callers find them there.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from cluster.spread import LabelSelector, Resources


class ReplicaConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    min_replicas: int = Field(default=1, ge=0)
    """Replicas kept alive even when idle."""
    max_replicas: int = Field(default=1, ge=1)
    """Most replicas the pool scales up to on queue depth."""
    num_cpus: float = Field(default=1.0, ge=0)
    """CPUs each replica reserves (and, pinned, the cores it gets)."""
    num_gpus: float = Field(default=0.0, ge=0)
    """GPUs each replica reserves; 1 runs the model on `cuda`."""
    max_inflight_batches: int = Field(default=2, ge=1)
    """Batches sent to one replica before its previous ones return (pipelining)."""
    read_ahead: bool | None = None
    """A replica actor of a dynamic model reads (unpickles) its next batch, and writes the
    last one's results, while its model runs a batch, on Ray threads beside the model's
    own (one per pipeline slot): the model no longer waits for that work between two
    batches. Pays where a batch runs off the replica's CPU (a GPU; a remote call); for a
    CPU model that work competes with the model for its cores, and measured slower.
    null (default): on for replicas with a GPU (`num_gpus` > 0), off otherwise; never with
    `max_inflight_batches: 1`."""
    link: bool = True
    """A dynamic model's replica actor takes its batches on a direct connection from its
    engine (a Unix socket on its node, TCP from another; a token from a Ray call first;
    `deployments.wire.link`)
    instead of a Ray call each (a Ray call costs far more CPU than a frame on a socket:
    `benchmarks.serve.ray_call`, `benchmarks.serve.transports`). One that reads
    ahead runs them on its device thread; one that does not, on the connection's own
    thread, pinned where the replica is, one at a time. False, or where no connection
    opens: a Ray call a batch. Sequence and generation replicas always take Ray calls."""
    batch_timeout_s: float | None = Field(default=120.0, gt=0)
    """Seconds one batch (or generation step) may run on a replica, counted from when it
    is sent: past it the replica is taken for hung and stopped, that batch's requests
    fail with `BatchTimedOut` (HTTP 504), its other batches run on another replica, and
    the pool starts a replacement. Raise it for models whose batches run longer; null
    waits forever."""
    resources: Resources = Field(default_factory=dict)
    """Extra Ray custom resources per replica: only nodes advertising them take one (e.g.
    {"numa0": 2}; {"worker": 0.001} with nodes started `raybatch join --resources
    '{"worker": 1}'`)."""
    labels: LabelSelector = Field(default_factory=dict)
    """Ray node labels a replica's node must match (Ray's label selector: `key: value`,
    `!value`, `in(a,b)`, `!in(a,b)`), e.g. {"raybatch.io/gpus": "!0"}; nodes get labels
    from `raybatch join --labels` (or `ray start --labels`) and Ray's own `ray.io/` ones."""
    spread: bool = True
    """Send each new replica actor, softly, to the node holding the fewest of this model's
    replicas among the alive nodes (matching `labels`) with room for it, so that losing a
    node does not take the model down (docs: placement, across hosts). Per pool: a model
    with several shards, or with its engine in several ingress replicas, spreads each
    one's share. False: Ray's default placement, which put both replicas of a model on
    its batching actor's node when measured."""
    env: dict[str, str] = Field(default_factory=dict)
    """Environment variables of the replica process (OMP_NUM_THREADS is set from num_cpus)."""
    scale_up_queue_items: int = Field(default=256, ge=1)
    """Queued items per replica above which the pool adds a replica. It also adds one
    (when none is starting) whenever the engine refused requests at its wait bound
    (`limits.max_queue_wait_s`), which a slow model reaches with fewer items queued."""
    scale_down_idle_s: float = Field(default=30.0, gt=0)
    """Seconds with nothing queued or running before the pool removes a replica."""
    pin: Literal["auto", "required", "off"] = "auto"
    """Pin the replica to whole physical cores (floor(num_cpus) of them, SMT siblings
    included) of one NUMA node, or local to its GPU (`cluster.pinning`). `auto`: pin when
    the replica has whole cores and the cluster advertises numa<N> resources (started by
    `raybatch up` / `raybatch join`) or it has a GPU; run unpinned, with a warning, when
    the cores are taken. `required`: pin or fail to start. `off`: never pin."""
    in_process: bool = False
    """Run each replica inside the process of the model's engine (the ingress replica for
    `batcher.placement: ingress`, else the batching actor), on a thread of its own, as
    `@serve.batch` runs a model: no Ray call per batch and no process to start (a Ray
    worker process costs seconds of CPU to start: `benchmarks.placement.startup`). The
    engine's process then reserves `num_cpus` per replica. For light CPU models and small
    machines: the model shares that process's cores and GIL with the front, is not pinned,
    and a batch past `batch_timeout_s` cannot be stopped (its replica is dropped and
    replaced; the stuck thread ends when the model returns). GPU models keep replica
    actors."""

    @model_validator(mode="after")
    def _bounds(self) -> ReplicaConfig:
        if self.min_replicas > self.max_replicas:
            raise ValueError(f"min_replicas={self.min_replicas} exceeds max_replicas="
                             f"{self.max_replicas}: lower min_replicas or raise max_replicas")
        if self.pin == "required" and self.num_cpus < 1:
            raise ValueError(f"pin='required' with num_cpus={self.num_cpus}: a pinned replica "
                             f"takes whole cores; raise num_cpus to >= 1 or set pin to 'auto'")
        if self.in_process:
            self._check_in_process()
        return self

    def _check_in_process(self) -> None:
        own = [f"num_gpus={self.num_gpus}" if self.num_gpus else "",
               "pin='required'" if self.pin == "required" else "",
               f"resources={self.resources}" if self.resources else "",
               f"labels={self.labels}" if self.labels else "",
               f"env={self.env}" if self.env else "",
               "read_ahead=true" if self.read_ahead else ""]
        own = [o for o in own if o]
        if own:
            raise ValueError(f"in_process=true with {', '.join(own)}: an in-process replica "
                             "shares its host's process, so it gets no GPU, cores, custom "
                             "resources, node or environment of its own (and reads no batch: "
                             "nothing is pickled); drop those settings or set in_process to "
                             "false (a replica actor of its own)")

    def reads_ahead(self) -> bool:
        """Whether a replica actor reads its next batch while its model runs one (never
        with one batch in flight: no next batch is there to read)."""
        if self.in_process or self.max_inflight_batches < 2:
            return False
        return self.num_gpus > 0 if self.read_ahead is None else self.read_ahead

    def host_cpus(self, parts: int = 1) -> float:
        """CPUs one of `parts` engine processes reserves for its in-process replicas (its
        share of `max_replicas`, rounded up); 0 when the replicas are actors."""
        return self.num_cpus * -(-self.max_replicas // parts) if self.in_process else 0.0

    # -- the direct connections' keepalive (deployments.wire.keepalive) --------------------------
    link_ping_s: float = Field(default=0.5, gt=0)
    """Seconds without a byte from the other end after which a direct connection's caller
    sends a ping (an empty frame, answered at once): the engine's connections to this
    model's replica actors (`link`), and its callers' to its batching actors
    (`batcher.link`). Nothing is sent while answers flow."""
    link_dead_s: float = Field(default=2.0, gt=0)
    """Seconds without a byte from the other end, while a batch (or bundle) or a ping is
    open on a direct connection, after which its caller takes it for lost: a host that lost
    power or is cut off sends no FIN or RST. A replica so lost is stopped and replaced; its
    batches are sent once more to another replica where their requests' deadlines allow,
    else fail with 503 and Retry-After (HTTP). A batching actor is first asked about through
    Ray (at most 5 s): one that answers (busy, or starved for CPU) keeps its connection, as
    losing it would fail every request open on it. Must exceed `link_ping_s`; raise it on a
    network with long stalls. TCP keepalive on both ends is set from it too."""

    @model_validator(mode="after")
    def _link_times(self) -> ReplicaConfig:
        if self.link_dead_s <= self.link_ping_s:
            raise ValueError(f"link_dead_s={self.link_dead_s} must exceed link_ping_s="
                             f"{self.link_ping_s}: a connection is taken for lost only after "
                             "a ping had time to be answered; raise link_dead_s")
        return self


class BatcherConfig(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)

    placement: Literal["actor", "ingress"] = "actor"
    """Where the engine runs. `actor`: one batching actor per model (per shard), batching
    the requests of every ingress replica together; one more Ray hop per bundle.
    `ingress`: each ingress replica runs the engine itself and sends batches straight to
    its own share of the model's replicas (one hop fewer; batches form per ingress
    replica, as with `@serve.batch`). Every kind; a stateful one with one ingress replica.
    Left out: `ingress` for dynamic batching with one shard on CPUs (measured faster on
    every path but the client's; the docs' placement page), `actor` otherwise: a model with GPUs
    (`replicas.num_gpus` > 0) batches across every ingress replica on one pool of GPU
    replicas, which `ingress` would multiply by the ingress replicas."""
    shards: int = Field(default=1, ge=1)
    """Batching actors for this model (placement `actor`); each owns its share of the
    replicas."""
    num_cpus: float = Field(default=0.0, ge=0)
    """CPUs each batching actor reserves (placement `actor`), besides what its in-process
    replicas reserve (`replicas.in_process`)."""
    resources: Resources = Field(default_factory=dict)
    """Placement `actor`: Ray custom resources each batching actor asks for, so that only
    nodes advertising them take it, e.g. {"head": 0.001} with the head started `ray
    start --head --resources '{"head": 1}'` (a small amount: a placement, not a share)."""
    labels: LabelSelector = Field(default_factory=dict)
    """Placement `actor`: Ray node labels a batching actor's node must match (a label
    selector, as `replicas.labels`), e.g. {"ray.io/node-id": "<id>"} or {"role": "front"}."""
    group: str | None = Field(default=None, pattern=r"^[A-Za-z0-9_.-]+$")
    """Placement `actor`, dynamic models with one shard: models naming the same group share
    one batching actor process (each keeps its own engine, queue, replicas and metrics in
    it), which asks Ray for the sum of their CPUs. Fewer processes to start and to keep
    on a small machine; a model busy enough to want a core of its own leaves it out."""
    link: bool = True
    """Placement `actor`: callers (ingress replicas, `RaybatchClient`) send bundles and
    cancels to the batching actor on a direct connection (a Unix socket on its node, TCP
    to the node's address from elsewhere; a token from Ray first) instead of a Ray actor call
    each (a Ray call costs far more CPU than a frame on a socket:
    `benchmarks.serve.ray_call`); everything else stays a Ray call. False,
    or where no connection opens (a network that allows only Ray's ports): a Ray call each."""

    def check_placed(self, model: str) -> None:
        """`resources` / `labels` place batching actors: none runs with placement `ingress`."""
        if self.placement == "ingress" and (self.resources or self.labels):
            asked = {k: v for k, v in (("resources", self.resources), ("labels", self.labels))
                     if v}
            raise ValueError(
                f"model {model!r}: batcher {asked} places batching actors, but its engine runs "
                "in the ingress (batcher.placement='ingress', the default for a dynamic model "
                "with one shard on CPUs): set batcher.placement to 'actor', or place the "
                "ingress instead (ingress.resources / ingress.labels)")


def group_placement_agrees(models: Sequence[Any]) -> None:
    """Models naming one `batcher.group` share one batching actor: one place for it."""
    first: dict[str, Any] = {}
    for m in models:
        b = m.batcher
        if b.group is None:
            continue
        other = first.setdefault(b.group, m)
        if (other.batcher.resources, other.batcher.labels) != (b.resources, b.labels):
            raise ValueError(
                f"models {other.name!r} and {m.name!r} share batching actor group "
                f"{b.group!r} but place it differently (batcher.resources "
                f"{dict(other.batcher.resources)} vs {dict(b.resources)}, batcher.labels "
                f"{dict(other.batcher.labels)} vs {dict(b.labels)}): give them the same")
