"""Fake sysfs trees for the topology and affinity tests (conftest.py hands them out).

`FakeSysfs` writes the files `cluster.topology` reads under a tmp_path laid out
like /sys, so a test can describe any machine. The named machines are the ones
the plans are asserted on: a two-socket box, a container limited by a cgroup
cpuset, a hybrid P-core/E-core CPU, a 4-GPU box, and a machine without NUMA files.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

NVIDIA, ASPEED, INTEL = "0x10de", "0x1a03", "0x8086"
NODE0 = [*range(0, 8), *range(16, 24)]  # two-socket box: 8 cores × 2 SMT per node
NODE1 = [*range(8, 16), *range(24, 32)]
GPU_ADDRESSES = ("0000:17:00.0", "0000:31:00.0", "0000:b1:00.0", "0000:ca:00.0")


def cpulist(cpus: Iterable[int]) -> str:
    """'0-3,8' style, as the kernel writes it."""
    out: list[str] = []
    run: list[int] = []
    for c in [*sorted(set(cpus)), None]:
        if run and (c is None or c != run[-1] + 1):
            out.append(str(run[0]) if len(run) == 1 else f"{run[0]}-{run[-1]}")
            run = []
        if c is not None:
            run.append(c)
    return ",".join(out)


class FakeSysfs:
    """Writes a tree under `root` laid out like /sys; each method adds one kind of file."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def write(self, rel: str, text: str) -> FakeSysfs:
        path = self.root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text + "\n")
        return self

    def cpus(self, siblings: Sequence[Sequence[int]], *, online: Iterable[int] | None = None,
             online_file: bool = True) -> FakeSysfs:
        """cpuN/topology/thread_siblings_list for each group of SMT siblings, and `online`."""
        every = sorted(c for group in siblings for c in group)
        for group in siblings:
            for c in group:
                self.write(f"devices/system/cpu/cpu{c}/topology/thread_siblings_list",
                           cpulist(group))
        if online_file:
            self.write("devices/system/cpu/online", cpulist(every if online is None else online))
        return self

    def numa(self, nodes: dict[int, Iterable[int]]) -> FakeSysfs:
        for n, cpus in nodes.items():
            self.write(f"devices/system/node/node{n}/cpulist", cpulist(cpus))
        self.write("devices/system/node/online", cpulist(nodes))
        return self

    def speed(self, source: str, values: dict[int, int]) -> FakeSysfs:
        """source: 'acpi_cppc/highest_perf', 'cpu_capacity' or 'cpufreq/cpuinfo_max_freq'."""
        for c, v in values.items():
            self.write(f"devices/system/cpu/cpu{c}/{source}", str(v))
        return self

    def pci(self, address: str, *, vendor: str, cls: str, numa_node: int = -1,
            local_cpus: Iterable[int] | None = None, device: str = "0x2330") -> FakeSysfs:
        dev = f"bus/pci/devices/{address}"
        self.write(f"{dev}/vendor", vendor).write(f"{dev}/class", cls)
        self.write(f"{dev}/device", device).write(f"{dev}/numa_node", str(numa_node))
        if local_cpus is not None:
            self.write(f"{dev}/local_cpulist", cpulist(local_cpus))
        return self

    def gpu(self, address: str, numa_node: int, local_cpus: Iterable[int] | None) -> FakeSysfs:
        """An NVIDIA data-centre GPU (class 0x030200, 3D controller)."""
        return self.pci(address, vendor=NVIDIA, cls="0x030200", numa_node=numa_node,
                        local_cpus=local_cpus)

    def cpuset(self, cpus: str) -> FakeSysfs:
        return self.write("fs/cgroup/cpuset.cpus.effective", cpus)


def build_two_socket(root: Path) -> FakeSysfs:
    """2 sockets × 8 cores × 2 SMT; sibling of CPU i is i+16; equal max frequency;
    a BMC's VGA device and a host bridge on PCI, neither of them a GPU."""
    fake = FakeSysfs(root).cpus([(i, i + 16) for i in range(16)]).numa({0: NODE0, 1: NODE1})
    fake.speed("cpufreq/cpuinfo_max_freq", dict.fromkeys(range(32), 3_000_000))
    fake.pci("0000:00:00.0", vendor=INTEL, cls="0x060000", numa_node=0)
    return fake.pci("0000:03:00.0", vendor=ASPEED, cls="0x030000", numa_node=0,
                    local_cpus=NODE0)




def build_container(root: Path) -> FakeSysfs:
    """The two-socket box seen from a container whose cpuset is 2 cores on each node."""
    return build_two_socket(root).cpuset("6-9,22-25")


def build_hybrid(root: Path) -> FakeSysfs:
    """8 P-cores with SMT (CPUs 2i, 2i+1; cores 2 and 5 favoured) and 8 E-cores (16-23).

    highest_perf ranks them; cpu_capacity says all are equal and must lose to it.
    """
    fake = FakeSysfs(root).cpus([*((2 * i, 2 * i + 1) for i in range(8)),
                                 *((c,) for c in range(16, 24))])
    perf = {c: 64 for c in range(16)} | {4: 68, 5: 68, 10: 68, 11: 68}
    perf |= {c: 40 for c in range(16, 24)}
    fake.speed("acpi_cppc/highest_perf", perf)
    return fake.speed("cpu_capacity", dict.fromkeys(range(24), 1024)).numa({0: range(24)})


def build_four_gpu(root: Path) -> FakeSysfs:
    """The two-socket box with GPUs 0, 1 on node 0 and 2, 3 on node 1, and an NVSwitch."""
    fake = build_two_socket(root)
    for address, node in zip(reversed(GPU_ADDRESSES), (1, 1, 0, 0)):
        fake.gpu(address, node, NODE0 if node == 0 else NODE1)
    return fake.pci("0000:05:00.0", vendor=NVIDIA, cls="0x068000", numa_node=0)


def build_no_numa(root: Path) -> FakeSysfs:
    """4 CPUs, no node directory, no `online` file (cpu3 is offline), no speed or sibling
    files, and a GPU whose firmware gives no NUMA node or local CPUs."""
    fake = FakeSysfs(root)
    for c in range(4):
        fake.write(f"devices/system/cpu/cpu{c}/uevent", "")
    fake.write("devices/system/cpu/cpu1/online", "1").write("devices/system/cpu/cpu3/online", "0")
    return fake.gpu("0000:65:00.0", -1, None)
