"""`raybatch topology`: the NUMA nodes, cores and GPUs this process may use, and the affinity plan.

    raybatch topology --replicas 4 --cores-per-replica 2
    raybatch topology --sysfs-root tests/fake/sys --json
"""

from __future__ import annotations

import argparse
import json
import sys
from collections import Counter

from cluster.affinity import AffinityPlan, PlacementError, max_replicas, plan_affinity
from cluster.topology import Topology, TopologyError, discover, format_cpulist
from raybatch.args import non_negative, positive


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sysfs-root", metavar="DIR",
                        help="read DIR instead of /sys (DIR/devices/system/node/node0/cpulist "
                             "...); the CPUs allowed then come from "
                             "DIR/fs/cgroup/cpuset.cpus.effective, not from this process")
    parser.add_argument("--replicas", type=non_negative(int), metavar="N",
                        help="CPU replicas to place (default: as many as fit)")
    parser.add_argument("--cores-per-replica", type=positive(int), default=1, metavar="K",
                        help="physical cores of each CPU replica, SMT siblings included "
                             "(default: 1)")
    parser.add_argument("--gpu-replicas", type=non_negative(int), metavar="M",
                        help="GPU replicas, one per GPU (default: one on every GPU)")
    parser.add_argument("--cores-per-gpu-replica", type=positive(int), default=1, metavar="K",
                        help="physical cores of each GPU replica, local to its GPU (default: 1)")
    parser.add_argument("--batcher-cores", type=non_negative(int), default=1, metavar="K",
                        help="fastest physical cores pinned to the batching actor (default: 1)")
    parser.add_argument("--json", action="store_true",
                        help="print {numa_nodes, gpus, speed_source, plan} as JSON")


def run(args: argparse.Namespace) -> int:
    try:
        topology = discover(args.sysfs_root)
    except TopologyError as e:
        print(f"raybatch topology: {e}", file=sys.stderr)
        return 2
    try:
        plan = _plan(topology, args)
    except PlacementError as e:
        if not args.json:
            print(describe_topology(topology))
        print(f"raybatch topology: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({**topology.to_dict(), "plan": plan.to_dict()}))
    else:
        print(describe_topology(topology))
        print(describe_plan(plan))
    return 0


def _plan(topology: Topology, args: argparse.Namespace) -> AffinityPlan:
    gpu_replicas = len(topology.gpus) if args.gpu_replicas is None else args.gpu_replicas
    sizes = {"gpu_replicas": gpu_replicas, "cores_per_gpu_replica": args.cores_per_gpu_replica,
             "batcher_cores": args.batcher_cores}
    replicas = args.replicas
    if replicas is None:
        replicas = max_replicas(topology, cores_per_replica=args.cores_per_replica, **sizes)
    return plan_affinity(topology, replicas=replicas, cores_per_replica=args.cores_per_replica,
                         **sizes)


def describe_topology(topology: Topology) -> str:
    """The machine in a few lines: nodes with their CPUs, cores and speeds; GPUs."""
    nodes, cores = len(topology.nodes), len(topology.cores)
    lines = [f"machine: {nodes} NUMA node{_s(nodes)}, {cores} physical core{_s(cores)}, "
             f"{len(topology.cpus)} CPUs usable; core speed from {topology.speed_source}"]
    for node in topology.nodes:
        speeds = Counter(core.speed for core in node.cores)
        speed = ""
        if len(speeds) > 1:  # only worth a word where cores differ (hybrid, preferred cores)
            speed = "; speeds " + ", ".join(f"{s} ×{n}" for s, n in
                                            sorted(speeds.items(), reverse=True))
        lines.append(f"  node {node.id}: CPUs {format_cpulist(node.cpus)} "
                     f"({len(node.cores)} cores{speed})")
    lines.append("GPUs:" if topology.gpus else "GPUs: none")
    for gpu in topology.gpus:
        local = format_cpulist(gpu.local_cpus) or "none usable"
        lines.append(f"  GPU {gpu.index}: {gpu.pci_address} {gpu.name}, NUMA node "
                     f"{_node(gpu.numa_node)}, local CPUs {local}")
    return "\n".join(lines)


def describe_plan(plan: AffinityPlan) -> str:
    """The plan, one line for the batcher and one per replica, then any notes."""
    lines = [f"plan: batcher and {len(plan.replicas)} replica{_s(len(plan.replicas))}",
             f"  batcher    node {_node(plan.batcher_node)}  "
             f"CPUs {format_cpulist(plan.batcher) or 'not pinned'}"]
    for i, r in enumerate(plan.replicas):
        gpu = "" if r.gpu is None else f"  GPU {r.gpu}"
        lines.append(f"  replica {i:<3}node {_node(r.numa_node)}  CPUs {format_cpulist(r.cpus)}"
                     f"  ({r.num_cores} core{_s(r.num_cores)}){gpu}")
    lines += [f"note: {note}" for note in plan.notes]
    return "\n".join(lines)


def _node(node: int | None) -> str:
    return "-" if node is None else str(node)


def _s(n: int) -> str:
    return "" if n == 1 else "s"
