"""A Ray node's NUMA resources and labels, and the NUMA node each replica asks for.

Ray knows nothing of NUMA, so Raybatch tells it: every node started by `raybatch
up` or `raybatch join` advertises one custom resource per NUMA node, `numa<N>`,
counted in the physical cores usable there (after the cgroup cpuset and affinity),
and labels saying what the node has (`raybatch.io/numa-nodes`, `…/primary-numa`,
`…/cores`, `…/gpus`). A pinned CPU replica of k cores asks for `{"numa<N>": k}`,
so Ray never places more pinned replicas on a NUMA node than it has cores, and
`cluster.pinning` then picks which cores on the machine itself.

Which N: the one with the most free slots (room for a replica of k cores, summed
over the nodes that advertise it), ties to the primary node, then the lowest N.
Nodes an autoscaler can still add count as nodes with nothing free (a node's
`raybatch.io/autoscale-numa<N>` labels say so; see `autoscale_labels`).
`NumaChooser` remembers the replicas it sent that Ray does not count yet (created
back to back, they all see the same free resources) until Ray's free count drops
by them or `claim_ttl_s` passes. A cluster that advertises no `numa<N>` (started
without Raybatch) gets no request at all: the replica then runs unpinned.

    ray_start_argv(discover(), address="10.0.0.1:6379")
    # ['ray', 'start', '--address', '10.0.0.1:6379', '--resources', '{"numa0": 8, ...}',
    #  '--labels', 'raybatch.io/cores=16,...', '--block']

A user's own `--resources` / `--labels` for `ray start` are merged into these, not
passed on after them (`ray start` keeps only the last of a repeated option).
"""

from __future__ import annotations

import json
import math
import re
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from cluster.pinning import NUMA_NODE_ENV, pinned_cores
from cluster.topology import Topology

LABEL_PREFIX = "raybatch.io/"
AUTOSCALE_PREFIX = f"{LABEL_PREFIX}autoscale-"
_NUMA = re.compile(r"^numa(\d+)$")
_AUTOSCALE = re.compile(rf"^{re.escape(AUTOSCALE_PREFIX)}numa(\d+)$")


def numa_resource(node: int) -> str:
    return f"numa{node}"


def node_resources(topology: Topology) -> dict[str, float]:
    """`{"numa<N>": physical cores usable on node N}` for every node of the machine."""
    return {numa_resource(n.id): float(len(n.cores)) for n in topology.nodes}


def node_labels(topology: Topology) -> dict[str, str]:
    """What the node has, as Ray node labels (values are plain numbers: Ray's label syntax)."""
    return {
        f"{LABEL_PREFIX}numa-nodes": str(len(topology.nodes)),
        f"{LABEL_PREFIX}primary-numa": str(topology.primary_node.id),
        f"{LABEL_PREFIX}cores": str(len(topology.cores)),
        f"{LABEL_PREFIX}gpus": str(len(topology.gpus)),
    }


def ray_start_argv(topology: Topology, *, address: str | None = None, head: bool = False,
                   num_cpus: int | None = None, block: bool = True, ray: str = "ray",
                   extra: Sequence[str] = ()) -> list[str]:
    """The `ray start` command that starts this machine as a node with its NUMA resources.

    Joins `address`, or starts a head node with `head=True`; exactly one of the two.
    """
    if (address is None) == (not head):
        raise ValueError("give exactly one of --address HOST:PORT (join that cluster) and "
                         f"--head (start one): got address={address!r}, head={head}")
    argv = [ray, "start", *(["--head"] if head else ["--address", str(address)])]
    if num_cpus is not None:
        argv += ["--num-cpus", str(num_cpus)]
    node = merge_node_options(topology, extra)
    labels = ",".join(f"{k}={v}" for k, v in sorted(node.labels.items()))
    argv += ["--resources", json.dumps(node.resources, sort_keys=True), "--labels", labels]
    return [*argv, *(["--block"] if block else []), *node.rest]


def _number(value: float) -> int | float:
    return int(value) if float(value).is_integer() else value


@dataclass(frozen=True, slots=True)
class NodeOptions:
    """A node's resources and labels, Raybatch's merged with a user's `ray start` options
    (their value wins for a key both name: `notes` say which), and the other options."""

    resources: dict[str, int | float]
    labels: dict[str, str]
    rest: list[str]
    notes: list[str]


def merge_node_options(topology: Topology, extra: Sequence[str] = ()) -> NodeOptions:
    """Merge the `--resources JSON` and `--labels k=v,...` among `extra` (`ray start`
    options a user passed on) into the node's numa<N> resources and labels: `ray start`
    keeps only the last of a repeated option, so passing them on would drop Raybatch's.

    merge_node_options(discover(), ["--resources", '{"x": 1}']).resources
    # {'numa0': 8, 'x': 1}
    """
    resources: dict[str, int | float] = {
        k: _number(v) for k, v in node_resources(topology).items()}
    labels = node_labels(topology)
    rest: list[str] = []
    notes: list[str] = []
    args = list(extra)
    while args:
        arg = args.pop(0)
        name, eq, value = arg.partition("=")
        if name not in ("--resources", "--labels"):
            rest.append(arg)
            continue
        if not eq:
            if not args:
                raise ValueError(f"{name} needs a value: e.g. {_EXAMPLES[name]}")
            value = args.pop(0)
        if name == "--resources":
            _merge(resources, _parse_resources(value), "resource", notes)
        else:
            _merge(labels, _parse_labels(value), "label", notes)
    return NodeOptions(resources, labels, rest, notes)


_EXAMPLES = {"--resources": """--resources '{"accel": 1}'""",
             "--labels": "--labels 'zone=a,rack=r1'"}


def _merge(mine: dict, theirs: Mapping, what: str, notes: list[str]) -> None:
    for key, value in theirs.items():
        if key in mine and mine[key] != value:
            notes.append(f"note: the {what} {key}={value} you passed replaces Raybatch's "
                         f"{key}={mine[key]}")
        mine[key] = value


def _parse_resources(text: str) -> dict[str, int | float]:
    try:
        parsed = json.loads(text)
    except json.JSONDecodeError as e:
        raise ValueError(f"--resources {text!r} is not valid JSON ({e.msg} at column "
                         f"{e.colno}): give an object of resource name to quantity, e.g. "
                         f"{_EXAMPLES['--resources']}") from None
    if not isinstance(parsed, dict):
        raise ValueError(f"--resources {text!r} is not a JSON object: give resource name "
                         f"to quantity, e.g. {_EXAMPLES['--resources']}")
    for key, value in parsed.items():
        if (isinstance(value, bool) or not isinstance(value, (int, float))
                or not 0 <= value < math.inf):  # json reads 1e400 as inf, NaN as nan
            raise ValueError(f"--resources: {key}={value!r} must be a finite number >= 0")
    return {k: _number(v) for k, v in parsed.items()}


def _parse_labels(text: str) -> dict[str, str]:
    """Ray's `--labels` syntax: `key=value` pairs separated by commas."""
    labels = {}
    for pair in filter(None, (p.strip() for p in text.split(","))):
        key, eq, value = pair.partition("=")
        if not eq or "=" in value or not key.strip():
            raise ValueError(f"--labels {text!r}: {pair!r} is not key=value; give "
                             f"comma-separated pairs, e.g. {_EXAMPLES['--labels']}")
        labels[key.strip()] = value.strip()
    return labels


@dataclass(frozen=True, slots=True)
class NodeNuma:
    """One Ray node's `numa<N>` resources: free and total cores by N, and its primary N."""

    available: Mapping[int, float]
    total: Mapping[int, float]
    primary: int | None = None


def numa_amounts(resources: Mapping[str, float]) -> dict[int, float]:
    """`{N: amount}` of the `numa<N>` entries of a Ray resource dict."""
    return {int(m.group(1)): float(v) for k, v in resources.items() if (m := _NUMA.match(k))}


def _slots(nodes: Sequence[NodeNuma], cores: int, which: str) -> dict[int, int]:
    """Replicas of `cores` that fit per N, node by node (a replica never spans Ray nodes)."""
    out: Counter[int] = Counter()
    for node in nodes:
        for n in node.total:
            out[n] += int(getattr(node, which).get(n, 0.0) // cores)
    return dict(out)


@dataclass
class NumaChooser:
    """Picks N for each new replica of one pool; see the module note. Pure: pass `now`."""

    claim_ttl_s: float = 30.0
    _pending: dict[int, int] = field(default_factory=dict)
    _seen: dict[int, int] = field(default_factory=dict)
    _claimed_at: dict[int, float] = field(default_factory=dict)

    def choose(self, nodes: Sequence[NodeNuma], cores: int, now: float) -> int | None:
        """The N to ask `numa<N>` of; None when no node advertises any."""
        if cores < 1:
            raise ValueError(f"cores={cores} must be >= 1")
        free, total = _slots(nodes, cores, "available"), _slots(nodes, cores, "total")
        if not total:
            return None
        self._observe(free, now)
        primary = Counter(node.primary for node in nodes if node.primary is not None)
        effective = {n: free.get(n, 0) - self._pending.get(n, 0) for n in total}
        # Where it fits now; else where it could ever fit (it stays pending there, which
        # is what makes an autoscaler add a node); else anywhere (the pool warns).
        for counts in (effective, total, dict.fromkeys(total, 1)):
            fits = [n for n in counts if counts[n] > 0]
            if fits:
                best = min(fits, key=lambda n, c=counts: (-c[n], -primary[n], n))
                break
        self._pending[best] = self._pending.get(best, 0) + 1
        self._claimed_at[best] = now
        return best

    def _observe(self, free: Mapping[int, int], now: float) -> None:
        """Drop claims Ray now counts (its free slots fell by them) or that have expired."""
        for n, slots in free.items():
            placed = max(0, self._seen.get(n, slots) - slots)
            self._pending[n] = max(0, self._pending.get(n, 0) - placed)
            self._seen[n] = slots
            if now - self._claimed_at.get(n, now) > self.claim_ttl_s:
                self._pending[n] = 0


def numa_request(replicas: Any, chooser: NumaChooser,
                 view: Callable[[], Sequence[NodeNuma]], now: float,
                 ) -> tuple[dict[str, float], dict[str, str]]:
    """(extra resources, extra env) of the next replica of `replicas` (a `ReplicaConfig`).

    A replica that will pin (whole cores, no GPU, `pin` not off) asks for `numa<N>`
    when the cluster has such resources (`view()`, asked only then), and is told N;
    a replica whose own `resources` name a numa<N> keeps it. GPU replicas number their
    devices in PCI order, like sysfs and NVML.
    """
    env: dict[str, str] = {}
    if replicas.num_gpus:
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"  # Ray's GPU ids then follow PCI order
    cores = pinned_cores(replicas.num_cpus)
    if replicas.pin == "off" or cores < 1 or replicas.num_gpus:
        return {}, env
    named = numa_amounts(replicas.resources)
    if named:
        return {}, {**env, NUMA_NODE_ENV: str(min(named))}
    n = chooser.choose(view(), cores, now)
    if n is None:
        return {}, env
    return {numa_resource(n): float(cores)}, {**env, NUMA_NODE_ENV: str(n)}


def numa_view() -> list[NodeNuma]:
    """The live Ray nodes that advertise `numa<N>` resources (needs `ray.init`), and the
    nodes an autoscaler may add (see `autoscale_labels`)."""
    import ray

    try:  # per-node availability has no public API in Ray 2.60
        from ray._private.state import available_resources_per_node

        available = available_resources_per_node()
    except (ImportError, AttributeError):
        available = None
    return numa_nodes(ray.nodes(), available)


def numa_nodes(nodes: Sequence[Mapping[str, Any]],
               available: Mapping[str, Mapping[str, float]] | None) -> list[NodeNuma]:
    """`numa_view` from `ray.nodes()` and the free resources per node id (None: unknown)."""
    out = []
    for node in nodes:
        if not node.get("Alive"):
            continue
        labels = node.get("Labels") or {}
        launchable = autoscaled_numa(labels)
        if launchable:  # a node the autoscaler can add: nothing free yet, room once added
            out.append(NodeNuma({}, launchable))
        total = numa_amounts(node.get("Resources", {}))
        if not total:
            continue
        free = total if available is None else numa_amounts(available.get(node["NodeID"], {}))
        primary = labels.get(f"{LABEL_PREFIX}primary-numa")
        out.append(NodeNuma(free, total, int(primary) if primary else None))
    return out


def autoscale_labels(resources: Mapping[str, float]) -> dict[str, str]:
    """Labels saying that an autoscaler can add nodes advertising `resources` (numa<N>).

    On Kubernetes the head carries them (`raybatch render k8s`): replicas created before
    any worker pod is up (every fresh deploy, every upgrade) then still ask for numa<N>,
    stay pending until a pod arrives, and pin there, instead of asking for CPUs alone and
    running unpinned for good.
    """
    return {f"{AUTOSCALE_PREFIX}{k}": str(_number(v)) for k, v in sorted(resources.items())}


def autoscaled_numa(labels: Mapping[str, str]) -> dict[int, float]:
    """`{N: cores}` of the `autoscale_labels` among a node's labels."""
    out = {}
    for key, value in labels.items():
        m = _AUTOSCALE.match(key)
        if m:
            out[int(m.group(1))] = float(value)
    return out
