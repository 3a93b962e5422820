"""Topology discovery from fake sysfs trees: nodes, cores, speeds, allowed CPUs, GPUs."""

from __future__ import annotations

import os
import subprocess
import sys
import types
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cluster.topology import (
    NvmlDevice,
    TopologyError,
    discover,
    format_cpulist,
    nvml_devices,
    parse_cpulist,
    pci_address,
)
from tests.unit.cluster.sysfs_fixtures import GPU_ADDRESSES, NODE0, NODE1

ROOT = Path(__file__).resolve().parents[3]


def test_parse_cpulist():
    assert parse_cpulist("0-3,8-11,16\n") == (0, 1, 2, 3, 8, 9, 10, 11, 16)
    assert parse_cpulist("5") == (5,)
    assert parse_cpulist("") == ()
    assert parse_cpulist("3,1-2,2") == (1, 2, 3)


@pytest.mark.parametrize("bad", ["a-b", "3-1", "1-", "0-3;5", "-1"])
def test_parse_cpulist_rejects_garbage_naming_the_file(bad):
    with pytest.raises(TopologyError, match=r"node0/cpulist: .* is not a cpulist"):
        parse_cpulist(bad, "node0/cpulist")


@given(st.sets(st.integers(0, 300)))
def test_format_and_parse_round_trip(cpus):
    text = format_cpulist(cpus)
    assert parse_cpulist(text) == tuple(sorted(cpus))
    assert text.count(",") < max(len(cpus), 1)  # runs are written as ranges, not one by one


def test_format_cpulist_writes_ranges():
    assert format_cpulist([16, 0, 1, 2, 3, 5]) == "0-3,5,16"


def test_two_socket_nodes_and_whole_cores(two_socket):
    topo = discover(two_socket.root)
    assert [n.id for n in topo.nodes] == [0, 1]
    assert topo.node(0).cpus == tuple(sorted(NODE0))
    assert topo.node(1).cpus == tuple(sorted(NODE1))
    assert [core.cpus for core in topo.node(0).cores] == [(i, i + 16) for i in range(8)]
    assert all(core.node == 1 for core in topo.node(1).cores)
    assert len(topo.cores) == 16 and topo.cpus == tuple(range(32))
    assert topo.speed_source == "cpufreq/cpuinfo_max_freq"
    assert {core.speed for core in topo.cores} == {3_000_000}
    assert topo.primary_node.id == 0  # a tie: the lowest CPU number decides


def test_explicit_root_ignores_this_processes_affinity(two_socket):
    # This process may use far fewer than 32 CPUs; the described machine has 32.
    assert len(discover(two_socket.root).cpus) == 32


def test_offline_cpus_are_left_out_and_their_siblings_kept(two_socket):
    two_socket.write("devices/system/cpu/online", "0-29")  # 30, 31 offline
    topo = discover(two_socket.root)
    assert 30 not in topo.cpus and 31 not in topo.cpus
    cores = {core.cpus for core in topo.cores}
    assert (14,) in cores and (15,) in cores and (13, 29) in cores


def test_odd_sibling_lists_still_give_each_cpu_one_core(two_socket):
    two_socket.write("devices/system/cpu/cpu16/topology/thread_siblings_list", "16")
    two_socket.write("devices/system/cpu/cpu1/topology/thread_siblings_list", "1,8,17")
    cores = [core.cpus for core in discover(two_socket.root).cores]
    assert (0, 16) in cores and (1, 17) in cores and (8, 24) in cores  # 8 is on node 1
    assert sorted(c for core in cores for c in core) == list(range(32))


def test_container_cpuset_limits_cpus_and_keeps_nodes(container):
    topo = discover(container.root)
    assert topo.cpus == (6, 7, 8, 9, 22, 23, 24, 25)
    assert [(n.id, [c.cpus for c in n.cores]) for n in topo.nodes] == [
        (0, [(6, 22), (7, 23)]), (1, [(8, 24), (9, 25)])]


def test_cpuset_that_splits_siblings_gives_single_cpu_cores(two_socket):
    topo = discover(two_socket.cpuset("0-3").root)
    assert [core.cpus for core in topo.cores] == [(0,), (1,), (2,), (3,)]
    assert [n.id for n in topo.nodes] == [0]  # node 1 has nothing usable


def test_allowed_cpus_argument_overrides_the_cpuset(container):
    assert discover(container.root, allowed_cpus=[0, 16, 31]).cpus == (0, 16, 31)


def test_nothing_usable_says_why(container):
    with pytest.raises(TopologyError, match=r"no CPU is both online \(0-31\) and allowed "
                                            r"\(40-41\).*cgroup cpuset"):
        discover(container.cpuset("40-41").root)


def test_missing_root_says_what_it_must_look_like(tmp_path):
    with pytest.raises(TopologyError, match=r"devices/system/cpu does not exist.*laid out"):
        discover(tmp_path / "nowhere")


def test_hybrid_ranks_p_cores_above_e_cores_by_highest_perf(hybrid):
    topo = discover(hybrid.root)
    assert topo.speed_source == "acpi_cppc/highest_perf"  # beats the flat cpu_capacity
    cores = topo.node(0).cores
    assert [c.cpus for c in cores[:2]] == [(4, 5), (10, 11)]  # favoured P-cores first
    assert [c.speed for c in cores] == [68] * 2 + [64] * 6 + [40] * 8
    assert [c.cpus for c in cores[-8:]] == [(c,) for c in range(16, 24)]


def test_speed_source_falls_back_when_a_cpu_lacks_the_better_one(hybrid):
    (hybrid.root / "devices/system/cpu/cpu23/acpi_cppc/highest_perf").unlink()
    topo = discover(hybrid.root)
    assert topo.speed_source == "cpu_capacity"
    assert {c.speed for c in topo.cores} == {1024}


def test_no_numa_files_is_one_node(no_numa):
    topo = discover(no_numa.root)
    assert [n.id for n in topo.nodes] == [0]
    assert topo.cpus == (0, 1, 2)  # cpu3 says it is offline
    assert [c.cpus for c in topo.cores] == [(0,), (1,), (2,)]
    assert topo.speed_source == "none"


def test_gpus_with_their_node_and_local_cpus(four_gpu):
    topo = discover(four_gpu.root)
    # The BMC's VGA (ASPEED) and the NVSwitch (bridge class) are not GPUs.
    assert [g.pci_address for g in topo.gpus] == list(GPU_ADDRESSES)
    assert [g.index for g in topo.gpus] == [0, 1, 2, 3]
    assert [g.numa_node for g in topo.gpus] == [0, 0, 1, 1]
    assert topo.gpus[0].local_cpus == tuple(sorted(NODE0))
    assert topo.gpus[3].local_cpus == tuple(sorted(NODE1))
    assert topo.gpus[0].name == "NVIDIA 0x2330"


def test_gpu_local_cpus_are_limited_to_the_allowed(four_gpu):
    topo = discover(four_gpu.cpuset("6-9,22-25").root)
    assert topo.gpus[0].local_cpus == (6, 7, 22, 23)
    assert topo.gpus[2].local_cpus == (8, 9, 24, 25)


def test_gpu_without_numa_information(no_numa):
    (gpu,) = discover(no_numa.root).gpus
    # numa_node -1 and no local_cpulist: near every CPU, and the only node is its node.
    assert (gpu.numa_node, gpu.local_cpus) == (0, (0, 1, 2))


def test_gpu_numa_node_is_inferred_from_local_cpus(two_socket):
    two_socket.gpu("0000:81:00.0", -1, NODE1)
    (gpu,) = discover(two_socket.root).gpus
    assert gpu.numa_node == 1


def test_nvml_decides_which_gpus_this_process_sees(four_gpu):
    # A container given one GPU still sees all four in /sys; NVML shows only its own.
    seen = [NvmlDevice(0, "0000:b1:00.0", "NVIDIA H100 80GB HBM3")]
    (gpu,) = discover(four_gpu.root, nvml=lambda: seen).gpus
    assert (gpu.index, gpu.pci_address, gpu.numa_node) == (0, "0000:b1:00.0", 1)
    assert gpu.name == "NVIDIA H100 80GB HBM3"
    assert gpu.local_cpus == tuple(sorted(NODE1))


def test_nvml_absent_falls_back_to_sysfs(four_gpu):
    assert len(discover(four_gpu.root, nvml=lambda: None).gpus) == 4


def test_pci_address_from_nvml_bus_id():
    assert pci_address("00000000:B1:00.0") == "0000:b1:00.0"
    assert pci_address("0001:17:00.0") == "0001:17:00.0"


class NVMLError(Exception):
    pass


def test_nvml_devices_reads_pynvml(monkeypatch):
    calls = []
    fake = types.SimpleNamespace(
        NVMLError=NVMLError,
        nvmlInit=lambda: calls.append("init"),
        nvmlShutdown=lambda: calls.append("shutdown"),
        nvmlDeviceGetCount=lambda: 2,
        nvmlDeviceGetHandleByIndex=lambda i: i,
        nvmlDeviceGetPciInfo=lambda h: types.SimpleNamespace(
            busId=[b"00000000:17:00.0", "00000000:CA:00.0"][h]),
        nvmlDeviceGetName=lambda h: [b"NVIDIA A100", "NVIDIA H100"][h],
    )
    monkeypatch.setitem(sys.modules, "pynvml", fake)
    assert nvml_devices() == [NvmlDevice(0, "0000:17:00.0", "NVIDIA A100"),
                              NvmlDevice(1, "0000:ca:00.0", "NVIDIA H100")]
    assert calls == ["init", "shutdown"]


def test_nvml_devices_without_a_driver_or_module(monkeypatch):
    def no_driver():
        raise NVMLError("NVML Shared Library Not Found")

    monkeypatch.setitem(sys.modules, "pynvml", types.SimpleNamespace(
        NVMLError=NVMLError, nvmlInit=no_driver))
    assert nvml_devices() is None
    monkeypatch.setitem(sys.modules, "pynvml", None)  # import fails
    assert nvml_devices() is None


def test_nvml_devices_when_a_gpu_is_lost_mid_listing(monkeypatch):
    def lost(i):
        raise NVMLError("GPU is lost")

    calls = []
    monkeypatch.setitem(sys.modules, "pynvml", types.SimpleNamespace(
        NVMLError=NVMLError, nvmlInit=lambda: None, nvmlDeviceGetCount=lambda: 1,
        nvmlDeviceGetHandleByIndex=lost, nvmlShutdown=lambda: calls.append("shutdown")))
    assert nvml_devices() is None and calls == ["shutdown"]


@pytest.mark.skipif(not Path("/sys/devices/system/cpu").is_dir(), reason="needs Linux sysfs")
def test_this_machine_within_this_processes_affinity():
    topo = discover(nvml=lambda: None)
    assert topo.cpus and set(topo.cpus) <= os.sched_getaffinity(0)
    assert sorted(c for core in topo.cores for c in core.cpus) == list(topo.cpus)


def test_placement_modules_do_not_load_ray():
    script = ("import sys, cluster.topology, cluster.affinity, raybatch.topology\n"
              "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')))")
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"
