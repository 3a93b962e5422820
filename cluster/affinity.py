"""The affinity plan: the CPUs the batching actor and each replica are pinned to.

CPUs are handed out in whole physical cores (a core with all its usable SMT
siblings), so no two pinned things share a core and no CPU is given twice. The
decisions, in order:

1. the batcher takes the fastest cores of the primary node (the node of the
   fastest core);
2. GPU replica i takes free cores local to GPU i (they are bound to that node);
3. CPU replicas take cores node by node: the primary node first, then the others
   by their best core; a replica spans nodes only when no node has enough free
   cores, and then as few nodes as it can.

A request that does not fit raises `PlacementError`, which says what was asked
for, what is free, and what to change; nothing is ever overlapped. The same
topology and request always give the same plan.

    plan = plan_affinity(discover(), replicas=4, cores_per_replica=2)
    plan.batcher            # (0, 16)
    plan.replicas[0].cpus   # (1, 2, 17, 18)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from cluster.topology import Core, Gpu, Topology, format_cpulist


class PlacementError(ValueError):
    """The replicas asked for do not fit the cores there are; the message says what to change."""


@dataclass(frozen=True, slots=True)
class Placement:
    """Where one replica runs: its CPUs, their NUMA node, and its GPU."""

    numa_node: int | None
    """None when no single node had the cores and the replica spans nodes."""
    cpus: tuple[int, ...]
    num_cores: int
    """Physical cores among `cpus`: the thread count a replica should use."""
    gpu: int | None = None
    """Index of the replica's GPU; None for a CPU replica."""

    def to_dict(self) -> dict[str, Any]:
        return {"numa_node": self.numa_node, "cpus": list(self.cpus),
                "num_cores": self.num_cores, "gpu": self.gpu}


@dataclass(frozen=True, slots=True)
class AffinityPlan:
    """The batcher's CPUs and one `Placement` per replica: GPU replicas first, then CPU ones."""

    batcher: tuple[int, ...]
    replicas: tuple[Placement, ...]
    batcher_node: int | None = None
    """The batcher's NUMA node (None if it spans nodes or has no cores)."""
    notes: tuple[str, ...] = ()
    """Where the plan had to settle for less: spanning nodes, a GPU's cores not local."""

    def to_dict(self) -> dict[str, Any]:
        return {"batcher": list(self.batcher), "batcher_numa_node": self.batcher_node,
                "replicas": [r.to_dict() for r in self.replicas], "notes": list(self.notes)}


def plan_affinity(topology: Topology, *, replicas: int = 0, cores_per_replica: int = 1,
                  gpu_replicas: int = 0, cores_per_gpu_replica: int = 1,
                  batcher_cores: int = 1) -> AffinityPlan:
    """Pin the batcher, `gpu_replicas` GPU replicas and `replicas` CPU replicas.

    Counts of cores are physical cores; each comes with its SMT siblings.

    On two sockets of 8 cores (CPUs 0-7,16-23 and 8-15,24-31), with replicas=2 and
    cores_per_replica=4: batcher (0, 16); replica 0 (1-4, 17-20) on node 0; replica 1
    (8-11, 24-27) on node 1, since node 0 has only 3 cores left.
    """
    _check_request(topology, replicas, cores_per_replica, gpu_replicas,
                   cores_per_gpu_replica, batcher_cores)
    free = _FreeCores(topology)
    notes: list[str] = []
    batcher = _place(free, batcher_cores, free.order, "the batcher", notes)
    placed = [_place_gpu_replica(free, gpu, cores_per_gpu_replica, notes)
              for gpu in topology.gpus[:gpu_replicas]]
    for _ in range(replicas):
        placed.append(_place(free, cores_per_replica, free.order, f"replica {len(placed)}",
                             notes))
    batcher_node = batcher.numa_node if batcher_cores else None
    return AffinityPlan(batcher.cpus, tuple(placed), batcher_node, tuple(notes))


def max_replicas(topology: Topology, *, cores_per_replica: int = 1, gpu_replicas: int = 0,
                 cores_per_gpu_replica: int = 1, batcher_cores: int = 1) -> int:
    """How many CPU replicas of `cores_per_replica` fit beside the batcher and GPU replicas."""
    _check_request(topology, 0, cores_per_replica, gpu_replicas, cores_per_gpu_replica,
                   batcher_cores)
    left = len(topology.cores) - batcher_cores - gpu_replicas * cores_per_gpu_replica
    return left // cores_per_replica


def _check_request(topology: Topology, replicas: int, cores_per_replica: int,
                   gpu_replicas: int, cores_per_gpu_replica: int, batcher_cores: int) -> None:
    """Reject a request that is malformed or larger than the machine, before taking anything.

    Replicas may span nodes, so a request fits exactly when its total fits.
    """
    for name, value, least in (("replicas", replicas, 0), ("gpu_replicas", gpu_replicas, 0),
                               ("cores_per_replica", cores_per_replica, 1),
                               ("cores_per_gpu_replica", cores_per_gpu_replica, 1),
                               ("batcher_cores", batcher_cores, 0)):
        if value < least:
            raise ValueError(f"{name}={value} must be >= {least}")
    gpus = topology.gpus
    if gpu_replicas > len(gpus):
        where = ", ".join(g.pci_address for g in gpus) or "none found"
        raise PlacementError(f"asked for {_n(gpu_replicas, 'GPU replica')} (one per GPU) but "
                             f"this machine shows {_n(len(gpus), 'GPU')} ({where}): ask for at "
                             f"most {len(gpus)}")
    fixed = batcher_cores + gpu_replicas * cores_per_gpu_replica
    if fixed + replicas * cores_per_replica > len(topology.cores):
        raise PlacementError(_out_of_cores(topology, replicas, cores_per_replica, gpu_replicas,
                                           cores_per_gpu_replica, batcher_cores))


def _out_of_cores(topology: Topology, replicas: int, cores_per_replica: int,
                  gpu_replicas: int, cores_per_gpu_replica: int, batcher_cores: int) -> str:
    """What was asked for, what is usable, and the requests that would fit."""
    have = len(topology.cores)
    fixed = batcher_cores + gpu_replicas * cores_per_gpu_replica
    asked = fixed + replicas * cores_per_replica
    parts = [f"{_n(batcher_cores, 'core')} for the batcher"]
    if gpu_replicas:
        parts.append(f"{_n(gpu_replicas, 'GPU replica')} × {cores_per_gpu_replica}")
    if replicas:
        parts.append(f"{_n(replicas, 'CPU replica')} × {cores_per_replica}")
    what = (f"asked for {asked} physical cores ({', '.join(parts)}) but {have} "
            f"{'is' if have == 1 else 'are'} usable here ({_n(len(topology.cpus), 'CPU')}, "
            f"{_n(len(topology.nodes), 'NUMA node')})")
    more = "or allow this process more cores (its cgroup cpuset or affinity)"
    if fixed > have:
        return (f"{what}: the batcher and GPU replicas alone need {fixed}; give them fewer "
                f"cores, {more}")
    left = have - fixed
    fixes = []
    if left >= cores_per_replica:
        fixes.append(f"ask for at most {_n(left // cores_per_replica, 'replica')} of "
                     f"{_n(cores_per_replica, 'core')}")
    if left >= replicas:
        each = "the replica" if replicas == 1 else f"each of the {replicas} replicas"
        fixes.append(f"give {each} {_n(left // replicas, 'core')}")
    fixes.append(more)
    return (f"{what}; {_n(left, 'core')} {'is' if left == 1 else 'are'} left for CPU replicas: "
            f"{', '.join(fixes)}")


def _n(count: int, word: str) -> str:
    return f"{count} {word}{'' if count == 1 else 's'}"


class _FreeCores:
    """Free cores per node, each node's fastest first; taking a core removes it."""

    def __init__(self, topology: Topology) -> None:
        self.by_node = {node.id: list(node.cores) for node in topology.nodes}
        primary = topology.primary_node.id
        rest = sorted((n for n in topology.nodes if n.id != primary),
                      key=lambda n: (-n.best_speed, n.id))
        self.order = (primary, *(n.id for n in rest))

    def take(self, k: int, order: tuple[int, ...],
             within: frozenset[int] | None = None) -> tuple[int | None, list[Core]] | None:
        """k cores from the first node in `order` that has them (only cores within `within`).

        (node, cores) when one node has them; (None, cores) spanning as few nodes as
        possible when none does; None, taking nothing, when there are not k at all.
        """
        fits = {n: [c for c in self.by_node[n] if within is None or within.issuperset(c.cpus)]
                for n in order}
        for n in order:
            if len(fits[n]) >= k:
                return n, self._remove(fits[n][:k])
        if sum(map(len, fits.values())) < k:
            return None
        got: list[Core] = []
        for n in sorted(order, key=lambda n: -len(fits[n])):  # stable: ties keep `order`
            got += fits[n][:k - len(got)]
        return None, self._remove(got)

    def _remove(self, cores: list[Core]) -> list[Core]:
        for core in cores:
            self.by_node[core.node].remove(core)
        return cores


def _place(free: _FreeCores, k: int, order: tuple[int, ...], who: str,
           notes: list[str], gpu: int | None = None) -> Placement:
    taken = free.take(k, order)
    if taken is None:  # _check_request counted the cores, so this is a bug, not a request
        raise AssertionError(f"{who}: fewer than {k} cores left after the request fitted")
    node, cores = taken
    if node is None:
        spans = ", ".join(str(n) for n in sorted({c.node for c in cores}))
        notes.append(f"{who} spans NUMA nodes {spans}: no node had {k} free cores")
    return Placement(node, _cpus(cores), k, gpu)


def _place_gpu_replica(free: _FreeCores, gpu: Gpu, k: int, notes: list[str]) -> Placement:
    """k free cores local to the GPU; else cores nearest to it, with a note."""
    order = free.order if gpu.numa_node not in free.by_node else (
        gpu.numa_node, *(n for n in free.order if n != gpu.numa_node))
    who = f"GPU replica {gpu.index}"
    taken = free.take(k, order, within=frozenset(gpu.local_cpus))
    if taken is None:
        placed = _place(free, k, order, who, notes, gpu.index)
        notes.append(f"GPU {gpu.index} ({gpu.pci_address}, NUMA node {gpu.numa_node}) has "
                     f"fewer than {_n(k, 'free local core')} (local CPUs "
                     f"{format_cpulist(gpu.local_cpus) or 'none usable'}); its replica got "
                     f"CPUs {format_cpulist(placed.cpus)}")
        return placed
    node, cores = taken
    if node is None:
        notes.append(f"{who} spans NUMA nodes: no node had {k} free cores local to its GPU")
    return Placement(node, _cpus(cores), k, gpu.index)


def _cpus(cores: list[Core]) -> tuple[int, ...]:
    return tuple(sorted(c for core in cores for c in core.cpus))
