"""Where on the cluster each Raybatch process goes: the placement selectors of the config
(`resources` and `labels` of replicas, batching actors and the ingress) and the node a
model's next replica actor is sent to (`replicas.spread`).

A model's replicas spread across nodes by default. The pool sends each new replica, with
a soft node affinity (`NodeAffinitySchedulingStrategy(soft=True,
_spill_on_unavailable=True)`, as Serve's own scheduler sends its replicas), to the node
holding the fewest of this model's replicas among the alive nodes that match its labels
and have room for it now; ties go to the node with room for the most such replicas, then
to an order hashed from the pool's process and the node (two pools of one model, e.g. its
shards, do not walk the nodes in the same order). With fewer than two such nodes it asks
for nothing: Ray places the replica as it would have (a single node, or one pending until
an autoscaler adds a node). A replica whose node is gone or full goes elsewhere (soft,
spilled), never waits for that node. A replacement goes to a surviving node: a dead node
is no candidate, and one where a replica was just lost comes last (the GCS may call a
host that lost power alive, with room, for a minute after the pool has seen it go).

Why not Ray's `scheduling_strategy="SPREAD"`: the GCS places every SPREAD actor round-robin
over the nodes, whoever asks, so interleaved creations (model a's replica, b's, a's, b's)
put all of a on one node and all of b on the other; and a SPREAD actor does not count the
replicas already there. Why not Ray 2.60's label selectors (`ray.io/node-id: !in(...)`
with a `fallback_strategy`): they say where a replica may not go, not which node has the
fewest, and the fallback is a second selector, not "anywhere with room". Measured on two
Ray nodes on one machine, two models of two replicas created a, b, a, b (docs/placement.md,
across hosts): Ray's default and SPREAD each gave every model one node in 4 of 4 rounds,
this spread one replica per node in 4 of 4.

NUMA pinning is untouched: the numa<N> a replica asks for (`cluster.raynode`) is part of
the demand a node must have room for, so a pinned replica is only sent where that N fits.
"""

from __future__ import annotations

import hashlib
import math
import re
import time
from collections import Counter
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Annotated, Any

from pydantic import AfterValidator

# Ray's own resources: asked with num_cpus / num_gpus (or not at all), not as custom ones.
_RAY_RESOURCES = {"CPU", "GPU", "memory", "object_store_memory"}
# Ray's (Kubernetes') label syntax: an optional DNS-subdomain prefix, a name of 63 chars.
_NAME = r"[A-Za-z0-9]([A-Za-z0-9_.-]{0,61}[A-Za-z0-9])?"
_LABEL_KEY = re.compile(rf"^({_NAME}(\.{_NAME})*/)?{_NAME}$")
_SELECTOR_VALUE = re.compile(
    rf"^(?P<neg>!)?(?:in\((?P<any>{_NAME}(?:, ?{_NAME})*)\)|(?P<one>{_NAME}))$")


def check_resources(value: dict[str, float]) -> dict[str, float]:
    """Custom resources a process asks Ray for: named, not Ray's own, not negative."""
    for name, amount in value.items():
        if name in _RAY_RESOURCES:
            raise ValueError(f"resources {value} names {name!r}, one of Ray's own resources: "
                             f"ask CPUs and GPUs with num_cpus / num_gpus; keep custom "
                             f"resources here (e.g. {{\"head\": 0.001}})")
        if not name or amount < 0 or not math.isfinite(amount):
            raise ValueError(f"resources {value}: {name!r}: {amount} must be a name and an "
                             "amount >= 0 (a node started with `--resources` advertises it)")
    return value


def check_labels(value: dict[str, str]) -> dict[str, str]:
    """A Ray label selector: `key: value`, `!value`, `in(a,b)` or `!in(a,b)`."""
    for key, selector in value.items():
        if not _LABEL_KEY.match(key) or len(key) > 253:
            raise ValueError(f"labels {value}: key {key!r} is not a Ray label key (an optional "
                             "DNS prefix and '/', then a name of at most 63 letters, digits, "
                             "'-', '_' or '.', starting and ending alphanumeric)")
        if not isinstance(selector, str) or not _SELECTOR_VALUE.match(selector):
            raise ValueError(f"labels {value}: {key}: {selector!r} is not a Ray label "
                             "selector: write a value, '!value', 'in(a,b)' or '!in(a,b)'")
    return value


Resources = Annotated[dict[str, float], AfterValidator(check_resources)]
LabelSelector = Annotated[dict[str, str], AfterValidator(check_labels)]


def label_matches(selector: Mapping[str, str], labels: Mapping[str, str]) -> bool:
    """Whether a node with `labels` satisfies `selector` (a negation also matches a node
    without the key, as in Ray and Kubernetes)."""
    for key, text in selector.items():
        m = _SELECTOR_VALUE.match(text)
        if m is None:
            return False
        values = m.group("any") or m.group("one")
        allowed = {v.strip() for v in values.split(",")}
        negate = m.group("neg") is not None
        if (labels.get(key) in allowed) == negate:
            return False
    return True


def actor_placement(resources: Mapping[str, float], labels: Mapping[str, str]
                    ) -> dict[str, Any]:
    """Ray actor options (also Serve's `ray_actor_options`) asking for a node that has
    `resources` and matches `labels`; nothing when neither is set."""
    return {**({"resources": dict(resources)} if resources else {}),
            **({"label_selector": dict(labels)} if labels else {})}


@dataclass(frozen=True, slots=True)
class NodeRoom:
    """One alive Ray node: its id, free and total resources, labels."""

    node_id: str
    available: Mapping[str, float]
    total: Mapping[str, float] = field(default_factory=dict)
    labels: Mapping[str, str] = field(default_factory=dict)


def _slots(demand: Mapping[str, float], free: Mapping[str, float]) -> float:
    """How many replicas asking `demand` fit in `free` (inf when it asks for nothing)."""
    asks = [(k, v) for k, v in demand.items() if v > 0]
    return min((free.get(k, 0.0) // v for k, v in asks), default=math.inf)


def _rank(salt: str, node_id: str) -> str:
    return hashlib.sha1(f"{salt}:{node_id}".encode()).hexdigest()


def spread_node(nodes: Sequence[NodeRoom], demand: Mapping[str, float],
                placed: Mapping[str, int], selector: Mapping[str, str] | None = None,
                salt: str = "", avoid: Collection[str] = ()) -> str | None:
    """The node for a model's next replica (see the module note); None: leave it to Ray.

    `demand`: what the replica asks (`CPU`, `GPU`, custom and numa<N> resources);
    `placed`: this model's replicas per node id, starting ones included; `avoid`: nodes
    taken last (where a replica was just lost).

        a, b = NodeRoom("a", {"CPU": 4}), NodeRoom("b", {"CPU": 4})
        spread_node([a, b], {"CPU": 1}, {"a": 1})  # 'b'
    """
    room = [n for n in nodes if label_matches(selector or {}, n.labels)
            and _slots(demand, n.available) >= 1]
    if len(room) < 2:
        return None
    best = min(room, key=lambda n: (n.node_id in avoid, placed.get(n.node_id, 0),
                                    -_slots(demand, n.available),
                                    -n.available.get("CPU", 0.0), _rank(salt, n.node_id)))
    return best.node_id


def node_rooms(nodes: Iterable[Mapping[str, Any]],
               available: Mapping[str, Mapping[str, float]] | None) -> list[NodeRoom]:
    """The alive nodes of `ray.nodes()`, with the free resources per node id (None:
    unknown, taken as all free)."""
    out = []
    for node in nodes:
        if not node.get("Alive"):
            continue
        total = dict(node.get("Resources") or {})
        free = total if available is None else dict(available.get(node["NodeID"], {}))
        out.append(NodeRoom(node["NodeID"], free, total, dict(node.get("Labels") or {})))
    return out


def cluster_rooms() -> list[NodeRoom]:
    """`node_rooms` of the running cluster (needs `ray.init`)."""
    import ray

    try:  # per-node availability has no public API in Ray 2.60
        from ray._private.state import available_resources_per_node

        available = available_resources_per_node()
    except (ImportError, AttributeError):
        available = None
    return node_rooms(ray.nodes(), available)


def actor_record(actor_id: str) -> dict[str, Any]:
    """The GCS's record of actor `actor_id` (hex): its "State", "Pid", "Address"...; {} once
    the GCS no longer knows it. Raises where the table cannot be read. Ray's private state
    API (no dashboard needed): read here only, so a Ray that moves it is mended here."""
    from ray._private.state import actors

    return actors(actor_id=actor_id)


def actor_node(actor: Any) -> str | None:
    """The node id of an alive actor, from the GCS's actor table; None while it is not
    running yet (or cannot be told)."""
    try:
        info = actor_record(actor._actor_id.hex())
    except Exception:  # a spread decision without it beats none
        return None
    if info.get("State") != "ALIVE":
        return None
    return info.get("Address", {}).get("NodeID") or None


def _process_salt() -> str:
    try:
        import ray

        return ray.get_runtime_context().get_actor_id() or ""
    except Exception:
        return ""


@dataclass
class ReplicaSpread:
    """The spread decisions of one pool (`deployments.replica.pool.ReplicaPool`). Pure but for
    `view`, `node_of` and `clock`, which tests replace.

    It remembers where each replica runs (the GCS's word, else the node it was sent to),
    and the nodes where one was lost (it left the pool without `removed`: it died, hung,
    or its host went silent): those come last for `avoid_s`, as the GCS may still count a
    host that lost power as alive for a minute, with room where the lost replica was."""

    view: Callable[[], Sequence[NodeRoom]] = cluster_rooms
    node_of: Callable[[Any], str | None] = actor_node
    salt: str | None = None
    clock: Callable[[], float] = time.monotonic
    avoid_s: float = 60.0
    _where: dict[int, str] = field(default_factory=dict)
    _removed: set[int] = field(default_factory=set)
    _lost: dict[str, float] = field(default_factory=dict)

    def removed(self, index: int) -> None:
        """Replica `index` was let go (scaled down): its node is no worse for it."""
        self._removed.add(index)

    def node(self, index: int, demand: Mapping[str, float], live: Sequence[tuple[int, Any]],
             selector: Mapping[str, str] | None = None) -> str | None:
        """The node for replica `index`; `live`: (index, actor) of this pool's other
        replicas, starting or serving."""
        if self.salt is None:
            self.salt = _process_salt()
        now = self.clock()
        self._forget_gone({i for i, _ in live}, now)
        placed: Counter[str] = Counter()
        for i, actor in live:
            where = (self.node_of(actor) if actor is not None else None) or self._where.get(i)
            if where:
                self._where[i] = where
                placed[where] += 1
        avoid = {n for n, at in self._lost.items() if now - at < self.avoid_s}
        node = spread_node(self.view(), demand, placed, selector, self.salt, avoid)
        if node is not None:
            self._where[index] = node
        return node

    def _forget_gone(self, live: set[int], now: float) -> None:
        for i in [i for i in self._where if i not in live]:
            node = self._where.pop(i)
            if i not in self._removed:
                self._lost[node] = now
        self._removed &= live

    def options(self, index: int, demand: Mapping[str, float],
                live: Sequence[tuple[int, Any]], selector: Mapping[str, str] | None = None
                ) -> dict[str, Any]:
        """Ray actor options sending replica `index` to its node (soft), or none."""
        node = self.node(index, demand, live, selector)
        if node is None:
            return {}
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        return {"scheduling_strategy": NodeAffinitySchedulingStrategy(
            node, soft=True, _spill_on_unavailable=True)}
