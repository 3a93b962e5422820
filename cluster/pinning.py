"""Pinning a replica process: which cores it takes on its machine, and applying them.

Ray counts a node's cores per NUMA node (`numa<N>` resources) but cannot say
*which* cores a replica gets; this module decides that on the machine itself.
A node-local allocator (one JSON file, `/tmp/raybatch-<uid>/cores.json`, guarded
by `fcntl.flock`) records the CPUs each live process has pinned, keyed by pid
and the pid's start time, so two replicas on one machine (of any model, from any
actor or cluster node sharing it) never pin the same core; an entry whose
process is gone (or whose pid now names another process) is reclaimed on the
next allocation. Cores are chosen by `cluster.affinity`'s rules: whole physical
cores with their SMT siblings, fastest first; from the NUMA node whose `numa<N>`
resource the replica was given (`RAYBATCH_NUMA_NODE`), else cores local to its
GPU, else the primary node first. When too few are free it raises
`PlacementError` with the counts; it never overlaps.

`pin_replica` applies `ReplicaConfig.pin`:
- `off`: never pin;
- `auto` (default): pin a replica that has whole cores (`num_cpus >= 1`) and was
  placed by Raybatch (a NUMA node named) or has a GPU; when that is impossible,
  log a warning and run unpinned;
- `required`: always pin, or fail the replica's start with `PlacementError`.
Pinning sets the affinity (`os.sched_setaffinity`), `OMP_NUM_THREADS` /
`MKL_NUM_THREADS` and torch's intra-op threads to the number of physical cores,
and one inter-op thread (settable once per process, before any parallel work).

Environment (read here, so tests and the multi-node test can describe a machine):
`RAYBATCH_SYSFS_ROOT` (a tree laid out like /sys), `RAYBATCH_CORES_FILE` (the
allocator's file), `RAYBATCH_NUMA_NODE` (set by the pool with the resource),
`RAYBATCH_NUMA_LOGICAL=1` (set on Kubernetes pods: `numa<N>` then names the N-th
NUMA node this process may use, not the host's node N, since a pod's resources are
written before the kubelet picks its cores).

    placement = pin_replica(config.replicas, ray.get_gpu_ids())
    placement.cpus      # (2, 18): pinned to core 2 and its sibling
"""

from __future__ import annotations

import fcntl
import importlib.util
import json
import logging
import os
import sys
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from cluster.affinity import PlacementError, plan_affinity
from cluster.topology import NumaNode, Topology, TopologyError, discover, format_cpulist

log = logging.getLogger(__name__)

SYSFS_ROOT_ENV = "RAYBATCH_SYSFS_ROOT"
CORES_FILE_ENV = "RAYBATCH_CORES_FILE"
NUMA_NODE_ENV = "RAYBATCH_NUMA_NODE"
NUMA_LOGICAL_ENV = "RAYBATCH_NUMA_LOGICAL"
PIN_MODES = ("auto", "required", "off")


def default_cores_file() -> Path:
    """`/tmp/raybatch-<uid>/cores.json`: one per machine and user, shared by all its Ray nodes."""
    return Path("/tmp") / f"raybatch-{os.getuid()}" / "cores.json"


def cores_file(env: Mapping[str, str] | None = None) -> Path:
    env = os.environ if env is None else env
    return Path(env[CORES_FILE_ENV]) if env.get(CORES_FILE_ENV) else default_cores_file()


def sysfs_root(env: Mapping[str, str] | None = None) -> str | None:
    """The sysfs root to read: $RAYBATCH_SYSFS_ROOT, else None (the real /sys)."""
    env = os.environ if env is None else env
    return env.get(SYSFS_ROOT_ENV) or None


def pinned_cores(num_cpus: float) -> int:
    """Physical cores a pinned replica of `num_cpus` takes: whole ones only (0 when < 1)."""
    return int(num_cpus)


@dataclass(frozen=True, slots=True)
class Pin:
    """One allocator entry: a live process and the CPUs it has pinned."""

    pid: int
    cpus: tuple[int, ...]
    start: str | None = None
    """The pid's start time (from /proc), so a reused pid is not mistaken for its owner."""
    numa_node: int | None = None
    gpu: int | None = None
    owner: str = ""
    note: str = ""
    """Where the choice settled for less (a GPU's cores not local, a span of nodes)."""


def process_start(pid: int) -> str | None:
    """The start time of `pid` in clock ticks since boot (/proc/PID/stat field 22); None if gone."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read().decode()
    except OSError:
        return None
    return stat[stat.rfind(")") + 2:].split()[19]


def process_alive(pid: int, start: str | None) -> bool:
    """Whether `pid` still runs and is the process that made the entry."""
    now = process_start(pid)
    if now is not None:
        return start is None or now == start
    try:  # no /proc (not Linux): ask the kernel
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


class CoreAllocator:
    """The node-local record of pinned CPUs: allocate, release, list (see the module note)."""

    def __init__(self, path: str | Path | None = None, *,
                 alive: Callable[[int, str | None], bool] = process_alive) -> None:
        self.path = Path(path) if path is not None else cores_file()
        self.alive = alive

    def allocate(self, topology: Topology, cores: int, *, pid: int | None = None,
                 numa_node: int | None = None, gpu: int | None = None,
                 owner: str = "") -> Pin:
        """`cores` free physical cores for `pid` (default: this process), recorded.

        A pid that already holds an entry gives its old CPUs back first.
        """
        pid = os.getpid() if pid is None else pid
        with self._locked() as pins:
            others = [p for p in pins.values() if p.pid != pid]
            placed = choose_cores(topology, cores, others, numa_node=numa_node, gpu=gpu)
            pin = Pin(pid, placed.cpus, process_start(pid), placed.numa_node, placed.gpu, owner,
                      placed.note)
            pins[pid] = pin
        return pin

    def release(self, pid: int | None = None) -> None:
        pid = os.getpid() if pid is None else pid
        with self._locked() as pins:
            pins.pop(pid, None)

    def pins(self) -> dict[int, Pin]:
        """The live entries (dead ones are dropped from the file on the way)."""
        with self._locked() as pins:
            return dict(pins)

    def _locked(self) -> _Locked:
        return _Locked(self)


class _Locked:
    """The allocator file read under an exclusive flock, live entries only; written on exit."""

    def __init__(self, allocator: CoreAllocator) -> None:
        self.allocator = allocator
        self.lock: Any = None
        self.pins: dict[int, Pin] = {}

    def __enter__(self) -> dict[int, Pin]:
        path = self.allocator.path
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        # A separate lock file: the JSON is replaced atomically, which changes its inode.
        self.lock = open(path.with_name(path.name + ".lock"), "a")
        fcntl.flock(self.lock, fcntl.LOCK_EX)
        try:
            for pin in _read_pins(path):
                if self.allocator.alive(pin.pid, pin.start):
                    self.pins[pin.pid] = pin
        except BaseException:
            self._unlock()
            raise
        return self.pins

    def __exit__(self, *exc: object) -> None:
        try:
            if exc[0] is None:
                path = self.allocator.path
                tmp = path.with_name(f"{path.name}.{os.getpid()}.tmp")
                pins = sorted(self.pins.values(), key=lambda p: p.pid)
                tmp.write_text(json.dumps({"pins": [asdict(p) for p in pins]}, indent=1))
                os.replace(tmp, path)
        finally:
            self._unlock()

    def _unlock(self) -> None:
        fcntl.flock(self.lock, fcntl.LOCK_UN)
        self.lock.close()


def _read_pins(path: Path) -> list[Pin]:
    """The entries of the allocator file; a torn or foreign file holds none (only pins)."""
    try:
        raw = json.loads(path.read_text()) if path.exists() else {}
    except (OSError, ValueError):
        return []
    pins = []
    for entry in raw.get("pins", []) if isinstance(raw, dict) else []:
        try:
            pins.append(Pin(**{**entry, "cpus": tuple(entry["cpus"])}))
        except (TypeError, KeyError):  # not an entry of ours: drop it
            continue
    return pins


@dataclass(frozen=True, slots=True)
class Chosen:
    """The cores `choose_cores` picked, and where it settled for less (`note`)."""

    cpus: tuple[int, ...]
    numa_node: int | None
    gpu: int | None
    note: str = ""


def choose_cores(topology: Topology, cores: int, taken: Iterable[Pin], *,
                 numa_node: int | None = None, gpu: int | None = None) -> Chosen:
    """`cores` whole free cores by `cluster.affinity`'s rules; PlacementError if too few.

    A named `numa_node` is a must (Ray reserved its resource there); a `gpu` (its
    index) prefers the cores local to that GPU, else the nearest; otherwise the
    primary node first.
    """
    if cores < 1:
        raise ValueError(f"cores={cores} must be >= 1")
    taken = list(taken)
    busy = {c for pin in taken for c in pin.cpus}
    if numa_node is not None and numa_node not in {n.id for n in topology.nodes}:
        raise PlacementError(
            f"NUMA node {numa_node} (from ${NUMA_NODE_ENV}) is not on this machine, whose "
            f"usable nodes are {', '.join(str(n.id) for n in topology.nodes)}: the node "
            f"advertises a numa{numa_node} resource it does not have; restart it with "
            f"`raybatch join` or `raybatch up`")
    free = _free_topology(topology, busy, numa_node, gpu)
    have = len(free.cores)
    if have < cores:
        raise PlacementError(_out_of_cores(topology, cores, have, taken, numa_node))
    gpus = len(free.gpus)
    plan = plan_affinity(free, replicas=1 - gpus, cores_per_replica=cores, gpu_replicas=gpus,
                         cores_per_gpu_replica=cores, batcher_cores=0)
    placed = plan.replicas[0]
    note = "; ".join(plan.notes)
    if gpu is not None and not gpus:
        note = f"GPU {gpu} is not in this machine's topology: cores not chosen by locality"
    return Chosen(placed.cpus, placed.numa_node, gpu, note)


def _free_topology(topology: Topology, busy: set[int], numa_node: int | None,
                   gpu: int | None) -> Topology:
    """The machine less the cores any CPU of which is pinned, within `numa_node` if named."""
    nodes = []
    for node in topology.nodes:
        if numa_node is not None and node.id != numa_node:
            continue
        free = tuple(core for core in node.cores if busy.isdisjoint(core.cpus))
        if free:
            nodes.append(NumaNode(node.id, free))
    gpus = tuple(g for g in topology.gpus if g.index == gpu)
    return Topology(tuple(nodes), gpus, topology.speed_source)


def _out_of_cores(topology: Topology, cores: int, have: int, taken: list[Pin],
                  numa_node: int | None) -> str:
    where = "this machine" if numa_node is None else f"NUMA node {numa_node}"
    usable = topology.cores if numa_node is None else topology.node(numa_node).cores
    cpus = {c for core in usable for c in core.cpus}
    holders = [f"pid {p.pid} ({format_cpulist(p.cpus)})" for p in taken
               if cpus.intersection(p.cpus)]
    held = f": pinned by {', '.join(holders)}" if holders else ""
    return (f"a replica needs {cores} physical core{'s' if cores != 1 else ''} on {where} but "
            f"{have} of its {len(usable)} usable cores {'is' if have == 1 else 'are'} "
            f"free{held}; lower replicas.num_cpus, run fewer replicas per node, or set "
            f"replicas.pin to 'auto' (run unpinned then) or 'off'")


@dataclass(frozen=True, slots=True)
class ReplicaPlacement:
    """What `pin_replica` did: reported by the replica's `info()`."""

    pinned: bool
    cpus: tuple[int, ...] = ()
    """The CPUs pinned to; () when not pinned."""
    numa_node: int | None = None
    gpu: int | None = None
    threads: int | None = None
    """Intra-op threads set (physical cores pinned); None when left as they were."""
    note: str = ""
    """Why it is not pinned, or where pinning settled for less."""

    def to_dict(self) -> dict[str, Any]:
        return {"pinned": self.pinned, "pinned_cpus": list(self.cpus),
                "numa_node": self.numa_node, "pin_note": self.note}


_original_affinity: set[int] | None = None


def _allowed_cpus() -> set[int]:
    """The CPUs this process could use before it pinned itself (re-pinning starts from them)."""
    global _original_affinity
    if _original_affinity is None:
        _original_affinity = set(os.sched_getaffinity(0))
    return _original_affinity


def pin_replica(replicas: Any, gpu_ids: Sequence[Any] = (), *,
                env: Mapping[str, str] | None = None, owner: str = "",
                allocator: CoreAllocator | None = None,
                set_affinity: Callable[[int, set[int]], None] | None = None,
                set_threads: Callable[[int], None] | None = None) -> ReplicaPlacement:
    """Pin this process as `replicas` (a `ReplicaConfig`) says; see the module note.

    Call it first in a replica's constructor, before the model (and torch) load.
    """
    env = os.environ if env is None else env
    numa_node = int(env[NUMA_NODE_ENV]) if env.get(NUMA_NODE_ENV) else None
    gpu = int(gpu_ids[0]) if len(gpu_ids) and str(gpu_ids[0]).isdigit() else None
    cores = pinned_cores(replicas.num_cpus)
    skip = _why_not(replicas.pin, cores, numa_node, gpu)
    if len(gpu_ids) and gpu is None and replicas.pin != "off":  # a UUID, say: no sysfs index
        skip = f"GPU id {gpu_ids[0]!r} is not an index: its local cores are unknown"
        if replicas.pin == "required":
            raise PlacementError(f"replicas.pin='required' but {skip}")
    if skip:
        return ReplicaPlacement(False, numa_node=numa_node, gpu=gpu, note=skip)
    allocator = allocator or CoreAllocator(cores_file(env))
    try:
        root = sysfs_root(env)
        topology = discover(root, allowed_cpus=None if root else _allowed_cpus())
        if numa_node is not None and env.get(NUMA_LOGICAL_ENV) == "1":
            numa_node = logical_numa_node(topology, numa_node)
        pin = allocator.allocate(topology, cores, numa_node=numa_node, gpu=gpu, owner=owner)
        try:
            (set_affinity or os.sched_setaffinity)(0, set(pin.cpus))
        except OSError:
            allocator.release()  # recorded but not applied: give the cores back
            raise
    except (PlacementError, TopologyError, OSError) as e:
        if replicas.pin == "required":
            raise PlacementError(f"replicas.pin='required' but this replica cannot be pinned: "
                                 f"{e}") from e
        log.warning("replica %s runs unpinned: %s", owner or os.getpid(), e)
        return ReplicaPlacement(False, numa_node=numa_node, gpu=gpu, note=f"unpinned: {e}")
    (set_threads or apply_threads)(cores)
    return ReplicaPlacement(True, pin.cpus, pin.numa_node, gpu, cores, pin.note)


def logical_numa_node(topology: Topology, index: int) -> int:
    """The id of the `index`-th NUMA node this process may use (see the module note)."""
    ids = [node.id for node in topology.nodes]
    if not 0 <= index < len(ids):
        raise PlacementError(
            f"numa{index} (${NUMA_LOGICAL_ENV}=1) names usable NUMA node #{index}, but this "
            f"process may use {len(ids)} ({', '.join(map(str, ids))}): the pod advertises more "
            f"NUMA nodes than the kubelet gave it; lower kubernetes numa_nodes")
    return ids[index]


def _why_not(mode: str, cores: int, numa_node: int | None, gpu: int | None) -> str:
    """Why `pin_replica` leaves the process unpinned; '' when it pins (or must try to)."""
    if mode not in PIN_MODES:
        raise ValueError(f"pin={mode!r} must be one of {', '.join(PIN_MODES)}")
    if mode == "off":
        return "pin: off"
    if cores < 1:
        if mode == "required":
            raise PlacementError("replicas.pin='required' needs num_cpus >= 1 (whole cores)")
        return "num_cpus < 1: shares cores, not pinned"
    if mode == "auto" and numa_node is None and gpu is None:
        return ("the cluster advertises no numa<N> resources (start it with `raybatch up` "
                "or `raybatch join`), or the replica asked for none")
    return ""


_interop_set = False


def apply_threads(n: int) -> None:
    """n intra-op threads (OpenMP, MKL, torch) and one torch inter-op thread.

    The environment is set first, so a torch or numpy imported later starts with n;
    torch (when installed) is then told directly. Its inter-op count can be set only
    once per process and only before parallel work, hence the guard.
    """
    global _interop_set
    for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        os.environ[var] = str(n)
    if "torch" not in sys.modules and importlib.util.find_spec("torch") is None:
        return
    import torch

    torch.set_num_threads(n)
    if not _interop_set:
        _interop_set = True
        try:
            torch.set_num_interop_threads(1)
        except RuntimeError:  # parallel work already ran, or someone set it first
            pass


def torch_threads() -> int | None:
    """torch's intra-op thread count as it is now; None when torch is not loaded, or not
    yet: another thread of this process may be importing it (an in-process replica)."""
    get = getattr(sys.modules.get("torch"), "get_num_threads", None)
    return get() if get is not None else None
