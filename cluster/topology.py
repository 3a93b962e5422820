"""Topology: the NUMA nodes, physical cores, core speeds and GPUs this process may use.

Everything is read from sysfs under an injectable root (`/sys` by default), so a
test can describe any machine as a directory tree. The invariant a `Topology`
keeps: every CPU in it is online and allowed to this process (its affinity mask,
which reflects cgroup cpusets; with an explicit root, that tree's
`fs/cgroup/cpuset.cpus.effective`), and belongs to exactly one node and exactly
one `Core`. A core's CPUs are its SMT siblings, so whoever takes a core takes all
of them. A machine with no NUMA information is one node, 0.

    topo = discover()                 # this machine, as this process may use it
    topo = discover("/tmp/fake/sys")  # a tree laid out like /sys
"""

from __future__ import annotations

import os
import re
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SYSFS = Path("/sys")
# Per-CPU speed files under devices/system/cpu/cpuN, best first; the first one that
# every usable CPU has ranks the cores (a mix of sources would compare apples and kHz).
SPEED_SOURCES = ("acpi_cppc/highest_perf", "cpu_capacity", "cpufreq/cpuinfo_max_freq")
GPU_VENDORS = {"0x10de": "NVIDIA", "0x1002": "AMD"}
# PCI classes: VGA, 3D controller (data-centre NVIDIA), display controller (AMD Instinct).
# Other vendors' VGA devices (a server's BMC, integrated graphics) are not GPUs to serve on.
GPU_CLASSES = ("0x0300", "0x0302", "0x0380")
_RANGE = re.compile(r"^(\d+)(?:-(\d+))?$")


class TopologyError(ValueError):
    """The machine's description cannot be read, or leaves this process no CPU to use."""


@dataclass(frozen=True, slots=True)
class Core:
    """One physical core: those of its SMT sibling CPUs this process may use, and its speed."""

    cpus: tuple[int, ...]
    node: int
    speed: int = 0
    """From the topology's `speed_source`; higher is faster, 0 when unknown."""


@dataclass(frozen=True, slots=True)
class NumaNode:
    """A NUMA node with its usable cores, fastest first (ties: lowest CPU number)."""

    id: int
    cores: tuple[Core, ...]

    @property
    def cpus(self) -> tuple[int, ...]:
        return tuple(sorted(c for core in self.cores for c in core.cpus))

    @property
    def best_speed(self) -> int:
        return max(core.speed for core in self.cores)


@dataclass(frozen=True, slots=True)
class Gpu:
    """A GPU, its NUMA node (None when sysfs does not say) and the usable CPUs local to it."""

    index: int
    """NVML's index when NVML is present, else the position in PCI address order."""
    pci_address: str
    numa_node: int | None
    local_cpus: tuple[int, ...]
    name: str = ""


@dataclass(frozen=True, slots=True)
class NvmlDevice:
    """A GPU as NVML shows it to this process (a container sees only its own)."""

    index: int
    pci_address: str
    name: str


@dataclass(frozen=True, slots=True)
class Topology:
    """The machine as this process may use it; see the module note for the invariant."""

    nodes: tuple[NumaNode, ...]
    gpus: tuple[Gpu, ...] = ()
    speed_source: str = "none"

    @property
    def cpus(self) -> tuple[int, ...]:
        return tuple(sorted(c for node in self.nodes for c in node.cpus))

    @property
    def cores(self) -> tuple[Core, ...]:
        return tuple(core for node in self.nodes for core in node.cores)

    @property
    def primary_node(self) -> NumaNode:
        """The node of the fastest core (ties: the core with the lowest CPU number)."""
        fastest = min(self.cores, key=lambda core: (-core.speed, core.cpus[0]))
        return next(node for node in self.nodes if node.id == fastest.node)

    def node(self, node_id: int) -> NumaNode:
        return next(node for node in self.nodes if node.id == node_id)

    def to_dict(self) -> dict[str, Any]:
        return {
            "numa_nodes": [
                {"id": n.id, "cpus": list(n.cpus),
                 "cores": [{"cpus": list(c.cpus), "speed": c.speed} for c in n.cores]}
                for n in self.nodes],
            "gpus": [
                {"index": g.index, "pci_address": g.pci_address, "name": g.name,
                 "numa_node": g.numa_node, "local_cpus": list(g.local_cpus)}
                for g in self.gpus],
            "speed_source": self.speed_source,
        }


def parse_cpulist(text: str, where: str = "cpulist") -> tuple[int, ...]:
    """CPUs of a Linux cpulist: '0-3,8-11,16' -> (0, 1, 2, 3, 8, 9, 10, 11, 16); '' -> ()."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        if not part.strip():
            continue
        m = _RANGE.match(part.strip())
        if not m or (m.group(2) and int(m.group(2)) < int(m.group(1))):
            raise TopologyError(f"{where}: {text.strip()!r} is not a cpulist like '0-3,8-11,16'")
        cpus.update(range(int(m.group(1)), int(m.group(2) or m.group(1)) + 1))
    return tuple(sorted(cpus))


def format_cpulist(cpus: Iterable[int]) -> str:
    """The cpulist of some CPUs: [0, 1, 2, 3, 16] -> '0-3,16'."""
    ranges: list[list[int]] = []
    for c in sorted(set(cpus)):
        if ranges and c == ranges[-1][1] + 1:
            ranges[-1][1] = c
        else:
            ranges.append([c, c])
    return ",".join(str(a) if a == b else f"{a}-{b}" for a, b in ranges)


def discover(sysfs_root: str | Path | None = None, *, allowed_cpus: Iterable[int] | None = None,
             nvml: Callable[[], list[NvmlDevice] | None] | None = None) -> Topology:
    """The machine under `sysfs_root` (default `/sys`) as this process may use it.

    `allowed_cpus` overrides where the allowed CPUs come from: this process's
    affinity for the real `/sys`, the tree's cgroup cpuset for an explicit root.
    `nvml` lists the GPUs NVML shows (default: `nvml_devices` for the real `/sys`,
    none for an explicit root, whose GPUs are the tree's).
    """
    root = Path(sysfs_root) if sysfs_root is not None else SYSFS
    cpu_dir = root / "devices/system/cpu"
    if not cpu_dir.is_dir():
        raise TopologyError(f"{cpu_dir} does not exist: the sysfs root must be laid out like "
                            f"/sys (ROOT/devices/system/cpu/cpu0/...)")
    online = _online_cpus(cpu_dir)
    allowed = set(allowed_cpus) if allowed_cpus is not None else _allowed_cpus(root, sysfs_root)
    usable = sorted(online if allowed is None else online & allowed)
    if not usable:
        raise TopologyError(f"no CPU is both online ({format_cpulist(online)}) and allowed "
                            f"({format_cpulist(allowed or ())}): check the cgroup cpuset "
                            f"or the affinity this process was started with")
    node_of = _node_of(root / "devices/system/node", usable)
    source, speed = _speeds(cpu_dir, usable)
    nodes = _nodes(_cores(cpu_dir, usable, node_of, speed))
    if nvml is None and sysfs_root is None:
        nvml = nvml_devices
    gpus = _gpus(root / "bus/pci/devices", usable, node_of, nvml() if nvml else None)
    return Topology(nodes=nodes, gpus=gpus, speed_source=source)


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def _read_cpulist(path: Path) -> tuple[int, ...] | None:
    text = _read(path)
    return None if text is None else parse_cpulist(text, str(path))


def _read_int(path: Path) -> int | None:
    text = _read(path)
    try:
        return None if text is None else int(text, 0)
    except ValueError:
        return None


def _online_cpus(cpu_dir: Path) -> set[int]:
    listed = _read_cpulist(cpu_dir / "online")
    if listed is not None:
        return set(listed)
    # No `online` file: every cpuN directory whose own `online` does not say 0
    # (cpu0 often has no `online` file: it cannot be taken offline).
    cpus = {int(d.name[3:]) for d in cpu_dir.glob("cpu*") if re.fullmatch(r"cpu\d+", d.name)}
    cpus = {c for c in cpus if _read(cpu_dir / f"cpu{c}" / "online") != "0"}
    if not cpus:
        raise TopologyError(f"{cpu_dir} has neither an 'online' cpulist nor cpuN directories")
    return cpus


def _allowed_cpus(root: Path, sysfs_root: str | Path | None) -> set[int] | None:
    """The CPUs this process may use; None when nothing restricts them."""
    if sysfs_root is not None:
        # A described machine: its cgroup cpuset, not the affinity of whoever reads it.
        cpuset = _read_cpulist(root / "fs/cgroup/cpuset.cpus.effective")
        return set(cpuset) if cpuset else None
    if hasattr(os, "sched_getaffinity"):
        return set(os.sched_getaffinity(0))  # includes the cgroup cpuset
    return None


def _node_of(node_dir: Path, usable: list[int]) -> dict[int, int]:
    """NUMA node of each usable CPU; CPUs no node lists go to the lowest node (0 without any)."""
    listed: dict[int, int] = {}
    nodes = sorted(int(d.name[4:]) for d in node_dir.glob("node*")
                   if re.fullmatch(r"node\d+", d.name))
    for n in nodes:
        for c in _read_cpulist(node_dir / f"node{n}" / "cpulist") or ():
            listed.setdefault(c, n)
    default = nodes[0] if nodes else 0
    return {c: listed.get(c, default) for c in usable}


def _speeds(cpu_dir: Path, usable: list[int]) -> tuple[str, dict[int, int]]:
    for source in SPEED_SOURCES:
        values = {c: _read_int(cpu_dir / f"cpu{c}" / source) for c in usable}
        if all(v is not None for v in values.values()):
            return source, {c: int(v or 0) for c, v in values.items()}
    return "none", dict.fromkeys(usable, 0)


def _cores(cpu_dir: Path, usable: list[int], node_of: dict[int, int],
           speed: dict[int, int]) -> list[Core]:
    """Usable CPUs grouped into physical cores; each CPU lands in exactly one core."""
    taken: set[int] = set()
    cores = []
    for c in usable:
        if c in taken:
            continue
        topo = cpu_dir / f"cpu{c}" / "topology"
        siblings = (_read_cpulist(topo / "thread_siblings_list")
                    or _read_cpulist(topo / "core_cpus_list") or (c,))
        # Keep to usable, untaken CPUs of c's node, so odd sibling lists cannot make
        # two cores share a CPU or a core straddle two nodes.
        group = sorted({s for s in (*siblings, c)
                        if s in node_of and s not in taken and node_of[s] == node_of[c]})
        taken.update(group)
        cores.append(Core(tuple(group), node_of[c], max(speed[s] for s in group)))
    return cores


def _nodes(cores: list[Core]) -> tuple[NumaNode, ...]:
    by_node: dict[int, list[Core]] = defaultdict(list)
    for core in cores:
        by_node[core.node].append(core)
    return tuple(NumaNode(n, tuple(sorted(cs, key=lambda core: (-core.speed, core.cpus[0]))))
                 for n, cs in sorted(by_node.items()))


def _gpus(pci_dir: Path, usable: list[int], node_of: dict[int, int],
          visible: list[NvmlDevice] | None) -> tuple[Gpu, ...]:
    """GPUs from sysfs; with NVML, the GPUs NVML shows, placed by their sysfs entries."""
    if visible is None:
        found = []
        for dev in sorted(pci_dir.glob("*")):
            vendor, cls = _read(dev / "vendor"), _read(dev / "class") or ""
            if vendor in GPU_VENDORS and cls[:6] in GPU_CLASSES:
                device = _read(dev / "device") or ""
                found.append(NvmlDevice(len(found), dev.name, f"{GPU_VENDORS[vendor]} {device}"))
        visible = found
    return tuple(_place_gpu(pci_dir / d.pci_address, d, usable, node_of) for d in visible)


def _place_gpu(dev: Path, seen: NvmlDevice, usable: list[int],
               node_of: dict[int, int]) -> Gpu:
    numa = _read_int(dev / "numa_node")
    node = numa if numa is not None and numa >= 0 else None  # -1: the firmware does not say
    listed = _read_cpulist(dev / "local_cpulist")
    if listed is not None:
        local = [c for c in usable if c in set(listed)]
    else:
        local = [c for c in usable if node is None or node_of[c] == node]
    if node is None and local and len({node_of[c] for c in local}) == 1:
        node = node_of[local[0]]
    return Gpu(seen.index, seen.pci_address, node, tuple(local), seen.name)


def nvml_devices() -> list[NvmlDevice] | None:
    """The GPUs NVML shows this process, or None without NVML (no `pynvml`, no driver)."""
    try:
        import pynvml  # nvidia-ml-py; optional
    except ImportError:
        return None
    try:
        pynvml.nvmlInit()
    except pynvml.NVMLError:  # no driver or no libnvidia-ml: sysfs alone will do
        return None
    try:
        return [_nvml_device(pynvml, i) for i in range(pynvml.nvmlDeviceGetCount())]
    except pynvml.NVMLError:  # a GPU lost mid-listing: better sysfs than no topology at all
        return None
    finally:
        pynvml.nvmlShutdown()


def _nvml_device(pynvml: Any, index: int) -> NvmlDevice:
    handle = pynvml.nvmlDeviceGetHandleByIndex(index)
    bus_id = _text(pynvml.nvmlDeviceGetPciInfo(handle).busId)
    return NvmlDevice(index, pci_address(bus_id), _text(pynvml.nvmlDeviceGetName(handle)))


def _text(value: str | bytes) -> str:
    return value.decode() if isinstance(value, bytes) else value


def pci_address(bus_id: str) -> str:
    """NVML's bus id in sysfs form: '00000000:17:00.0' -> '0000:17:00.0'."""
    domain, _, rest = bus_id.strip().lower().partition(":")
    return f"{int(domain, 16):04x}:{rest}"
