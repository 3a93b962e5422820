"""The node-local core allocator and `pin_replica` on fake sysfs trees (no Ray, no real pins)."""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
from pathlib import Path

import pytest

from cluster.affinity import PlacementError
from cluster.config import ReplicaConfig
from cluster.pinning import (
    CORES_FILE_ENV,
    NUMA_LOGICAL_ENV,
    NUMA_NODE_ENV,
    SYSFS_ROOT_ENV,
    CoreAllocator,
    Pin,
    choose_cores,
    pin_replica,
)
from cluster.topology import discover
from tests.unit.cluster.sysfs_fixtures import NODE0, NODE1

ROOT = Path(__file__).resolve().parents[3]


class Processes:
    """Which fake pids are alive: the allocator's liveness check, by hand."""

    def __init__(self) -> None:
        self.dead: set[int] = set()

    def __call__(self, pid: int, start: str | None) -> bool:
        return pid not in self.dead


@pytest.fixture
def procs() -> Processes:
    return Processes()


@pytest.fixture
def allocator(tmp_path: Path, procs: Processes) -> CoreAllocator:
    return CoreAllocator(tmp_path / "pins" / "cores.json", alive=procs)


def whole_cores(cpus: tuple[int, ...]) -> bool:
    """Two-socket box: CPU i and i+16 are siblings; a pinned set holds both or neither."""
    return all((c + 16 if c < 16 else c - 16) in cpus for c in cpus)


def test_allocations_never_overlap_and_keep_siblings_together(two_socket, allocator):
    topo = discover(two_socket.root)
    pins = [allocator.allocate(topo, 3, pid=100 + i) for i in range(5)]
    cpus = [c for p in pins for c in p.cpus]
    assert len(cpus) == len(set(cpus)) == 5 * 3 * 2
    assert all(whole_cores(p.cpus) for p in pins)
    # Primary node first, then the other one; the last spans both (2 cores left on each).
    assert [p.numa_node for p in pins] == [0, 0, 1, 1, None]
    assert pins[0].cpus == (0, 1, 2, 16, 17, 18)
    assert "spans NUMA nodes 0, 1" in pins[4].note
    with pytest.raises(PlacementError, match=r"needs 3 physical cores on this machine but 1 of "
                                             r"its 16 usable cores is free"):
        allocator.allocate(topo, 3, pid=200)
    assert sorted(allocator.pins()) == [100, 101, 102, 103, 104]


def test_the_named_numa_node_is_a_must(two_socket, allocator):
    topo = discover(two_socket.root)
    a = allocator.allocate(topo, 4, pid=1, numa_node=1)
    b = allocator.allocate(topo, 4, pid=2, numa_node=1)
    assert set(a.cpus) | set(b.cpus) == set(NODE1)
    assert (a.numa_node, b.numa_node) == (1, 1)
    with pytest.raises(PlacementError) as e:
        allocator.allocate(topo, 1, pid=3, numa_node=1)
    assert str(e.value).startswith(
        "a replica needs 1 physical core on NUMA node 1 but 0 of its 8 usable cores are free: "
        "pinned by pid 1 (8-11,24-27), pid 2 (12-15,28-31); lower replicas.num_cpus")
    assert allocator.allocate(topo, 1, pid=3).numa_node == 0  # unnamed: node 0 still has room
    with pytest.raises(PlacementError, match=r"NUMA node 7 .* is not on this machine, whose "
                                             r"usable nodes are 0, 1"):
        allocator.allocate(topo, 1, pid=4, numa_node=7)


def test_dead_pids_give_their_cores_back(two_socket, allocator, procs):
    topo = discover(two_socket.root)
    first = allocator.allocate(topo, 8, pid=10, numa_node=0)
    with pytest.raises(PlacementError):
        allocator.allocate(topo, 1, pid=11, numa_node=0)
    procs.dead.add(10)
    assert allocator.allocate(topo, 8, pid=11, numa_node=0).cpus == first.cpus
    assert sorted(allocator.pins()) == [11]


def test_a_real_exited_process_and_a_reused_pid_are_reclaimed(two_socket, tmp_path):
    topo = discover(two_socket.root)
    allocator = CoreAllocator(tmp_path / "cores.json")  # the real liveness check
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    allocator.allocate(topo, 8, pid=gone.pid, numa_node=0)
    # This pid, but recorded with another start time: the pid was reused since.
    entries = json.loads(allocator.path.read_text())["pins"]
    entries.append({"pid": os.getpid(), "cpus": list(NODE1), "start": "1", "numa_node": 1})
    allocator.path.write_text(json.dumps({"pins": entries}))
    mine = allocator.allocate(topo, 8, numa_node=1)
    assert mine.pid == os.getpid() and set(mine.cpus) == set(NODE1)
    assert sorted(allocator.pins()) == [os.getpid()]


def test_allocating_again_replaces_the_pids_own_entry(two_socket, allocator):
    topo = discover(two_socket.root)
    allocator.allocate(topo, 8, pid=5, numa_node=0)
    again = allocator.allocate(topo, 8, pid=5, numa_node=0)
    assert set(again.cpus) == set(NODE0)
    allocator.release(5)
    assert allocator.pins() == {}


def test_gpu_replicas_take_cores_local_to_their_gpu(four_gpu, allocator):
    topo = discover(four_gpu.root)
    by_index = {g.index: g for g in topo.gpus}
    assert by_index[2].numa_node == 1
    cpu_replica = allocator.allocate(topo, 2, pid=1)  # node 0, the primary
    gpu2 = allocator.allocate(topo, 2, pid=2, gpu=2)
    gpu0 = allocator.allocate(topo, 2, pid=3, gpu=0)
    assert (gpu2.numa_node, gpu2.gpu) == (1, 2) and set(gpu2.cpus) <= set(NODE1)
    assert gpu0.numa_node == 0 and set(gpu0.cpus) <= set(NODE0)
    assert not set(gpu0.cpus) & set(cpu_replica.cpus)
    unknown = allocator.allocate(topo, 1, pid=4, gpu=9)
    assert unknown.gpu == 9 and "GPU 9 is not in this machine's topology" in unknown.note


def test_a_gpu_short_of_local_cores_takes_whole_cores_elsewhere_with_a_note(four_gpu):
    topo = discover(four_gpu.root)
    busy = [Pin(1, tuple(c for c in NODE1 if c not in (15, 31)))]
    chosen = choose_cores(topo, 2, busy, gpu=3)  # GPU 3 is on node 1: one free core there
    assert chosen.numa_node == 0 and set(chosen.cpus) <= set(NODE0)  # one node, not a span
    assert "GPU 3 (0000:ca:00.0, NUMA node 1) has fewer than 2 free local cores" in chosen.note
    assert choose_cores(topo, 1, busy, gpu=3).cpus == (15, 31)


def test_primary_node_is_the_fastest_cores(hybrid, allocator):
    topo = discover(hybrid.root)
    assert allocator.allocate(topo, 1, pid=1).cpus == (4, 5)  # a favoured P-core
    assert allocator.allocate(topo, 1, pid=2).cpus == (10, 11)


def test_concurrent_processes_never_share_a_core(two_socket, tmp_path):
    """Real processes, real flock: each allocates and holds its pin until told to exit."""
    path = tmp_path / "cores.json"
    script = ("import sys; from cluster.pinning import CoreAllocator; "
              "from cluster.topology import discover; "
              f"p = CoreAllocator({str(path)!r}).allocate(discover({str(two_socket.root)!r}), 2); "
              "print(','.join(map(str, p.cpus)), flush=True); sys.stdin.read()")
    procs = [subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True) for _ in range(6)]
    try:
        got = [p.stdout.readline().strip() for p in procs]
    finally:
        for p in procs:
            p.communicate("", timeout=60)
    cpus = [int(c) for line in got for c in line.split(",")]
    assert len(cpus) == 6 * 4 and len(set(cpus)) == len(cpus), got


class Applied:
    def __init__(self) -> None:
        self.affinity: list[set[int]] = []
        self.threads: list[int] = []

    def set_affinity(self, pid: int, cpus: set[int]) -> None:
        assert pid == 0
        self.affinity.append(cpus)

    def set_threads(self, n: int) -> None:
        self.threads.append(n)


def pin(replicas: ReplicaConfig, env: dict[str, str], allocator: CoreAllocator,
        gpu_ids: tuple = ()) -> tuple:
    applied = Applied()
    placement = pin_replica(replicas, gpu_ids, env=env, allocator=allocator,
                            set_affinity=applied.set_affinity, set_threads=applied.set_threads)
    return placement, applied


def test_pin_replica_pins_to_its_numa_node_and_sets_threads(two_socket, allocator):
    env = {SYSFS_ROOT_ENV: str(two_socket.root), NUMA_NODE_ENV: "1"}
    placement, applied = pin(ReplicaConfig(num_cpus=2.5), env, allocator)
    assert placement.pinned and placement.numa_node == 1
    assert placement.cpus == (8, 9, 24, 25) and applied.affinity == [{8, 9, 24, 25}]
    assert applied.threads == [2] and placement.threads == 2  # physical cores, not CPUs
    assert placement.to_dict()["pinned_cpus"] == [8, 9, 24, 25]
    assert allocator.pins()[os.getpid()].cpus == (8, 9, 24, 25)


def test_a_pod_counts_its_numa_nodes_from_0_whichever_host_node_it_got(two_socket, allocator):
    """Kubernetes: the pod advertises numa0, the kubelet gave it cores of host node 1."""
    two_socket.cpuset("10-13,26-29")  # 4 cores of node 1 only
    env = {SYSFS_ROOT_ENV: str(two_socket.root), NUMA_NODE_ENV: "0", NUMA_LOGICAL_ENV: "1"}
    placement, applied = pin(ReplicaConfig(num_cpus=2, pin="required"), env, allocator)
    assert placement.pinned and placement.numa_node == 1  # the host's node, as reported
    assert applied.affinity == [{10, 11, 26, 27}]
    without, _ = pin(ReplicaConfig(num_cpus=2), {**env, NUMA_LOGICAL_ENV: ""}, allocator)
    assert not without.pinned and "NUMA node 0 (from $RAYBATCH_NUMA_NODE) is not on this " \
        "machine" in without.note
    with pytest.raises(PlacementError, match=r"numa1 \(\$RAYBATCH_NUMA_LOGICAL=1\) names usable "
                                             r"NUMA node #1, but this process may use 1 \(1\)"):
        pin(ReplicaConfig(num_cpus=2, pin="required"), {**env, NUMA_NODE_ENV: "1"}, allocator)


def test_auto_leaves_replicas_unpinned_where_raybatch_did_not_place_them(two_socket, allocator):
    env = {SYSFS_ROOT_ENV: str(two_socket.root)}
    for replicas, why in ((ReplicaConfig(num_cpus=2), "advertises no numa<N> resources"),
                          (ReplicaConfig(num_cpus=0.5), "num_cpus < 1"),
                          (ReplicaConfig(num_cpus=2, pin="off"), "pin: off")):
        placement, applied = pin(replicas, {**env, NUMA_NODE_ENV: "0"} if "pin" in why else env,
                                 allocator)
        assert not placement.pinned and why in placement.note
        assert applied.affinity == applied.threads == []
    assert allocator.pins() == {}
    placement, _ = pin(ReplicaConfig(num_cpus=2, pin="required"), env, allocator)
    assert placement.pinned and placement.numa_node == 0  # required: primary node first


def test_auto_runs_unpinned_with_a_warning_when_cores_run_out(two_socket, allocator, caplog):
    env = {SYSFS_ROOT_ENV: str(two_socket.root), NUMA_NODE_ENV: "0"}
    allocator.allocate(discover(two_socket.root), 7, pid=1, numa_node=0)
    with caplog.at_level(logging.WARNING, logger="cluster.pinning"):
        placement, applied = pin(ReplicaConfig(num_cpus=2), env, allocator)
    assert not placement.pinned and applied.affinity == []
    assert "needs 2 physical cores on NUMA node 0 but 1 of its 8" in placement.note
    assert "runs unpinned" in caplog.text
    assert sorted(allocator.pins()) == [1]
    with pytest.raises(PlacementError, match=r"pin='required' but this replica cannot be "
                                             r"pinned: a replica needs 2 physical cores"):
        pin(ReplicaConfig(num_cpus=2, pin="required"), env, allocator)


def test_required_with_an_unreadable_machine_fails_and_auto_does_not(tmp_path, allocator):
    env = {SYSFS_ROOT_ENV: str(tmp_path / "nothing"), NUMA_NODE_ENV: "0"}
    placement, _ = pin(ReplicaConfig(num_cpus=1), env, allocator)
    assert not placement.pinned and "does not exist" in placement.note
    with pytest.raises(PlacementError, match="does not exist"):
        pin(ReplicaConfig(num_cpus=1, pin="required"), env, allocator)


def test_affinity_refused_by_the_kernel_gives_the_cores_back(two_socket, allocator):
    def refuse(pid: int, cpus: set[int]) -> None:
        raise OSError(22, "Invalid argument")

    env = {SYSFS_ROOT_ENV: str(two_socket.root), NUMA_NODE_ENV: "0"}
    placement = pin_replica(ReplicaConfig(num_cpus=1), env=env, allocator=allocator,
                            set_affinity=refuse, set_threads=lambda n: None)
    assert not placement.pinned and "Invalid argument" in placement.note
    assert allocator.pins() == {}


def test_gpu_replica_pins_near_its_gpu_without_a_numa_resource(four_gpu, allocator):
    env = {SYSFS_ROOT_ENV: str(four_gpu.root)}
    placement, applied = pin(ReplicaConfig(num_cpus=1, num_gpus=1), env, allocator, ("3",))
    assert placement.pinned and placement.gpu == 3 and placement.numa_node == 1
    assert applied.affinity[0] <= set(NODE1)
    by_uuid, _ = pin(ReplicaConfig(num_cpus=1, num_gpus=1), env, allocator, ("GPU-5e1f",))
    assert not by_uuid.pinned and "'GPU-5e1f' is not an index" in by_uuid.note


def test_pin_replica_really_pins_a_process(tmp_path):
    """Pin a child process to CPU 0 of this machine (described by a one-node tree)."""
    if not hasattr(os, "sched_setaffinity") or 0 not in os.sched_getaffinity(0):
        pytest.skip("needs Linux affinity and CPU 0")
    cpu = tmp_path / "sys/devices/system/cpu"
    (cpu / "cpu0").mkdir(parents=True)
    (cpu / "online").write_text("0\n")
    script = ("import os; from cluster.config import ReplicaConfig; "
              "from cluster.pinning import pin_replica; "
              "p = pin_replica(ReplicaConfig(num_cpus=1, pin='required')); "
              "import torch; "
              "print(p.cpus, sorted(os.sched_getaffinity(0)), os.environ['OMP_NUM_THREADS'], "
              "torch.get_num_threads(), torch.get_num_interop_threads())")
    env = {**os.environ, SYSFS_ROOT_ENV: str(tmp_path / "sys"),
           CORES_FILE_ENV: str(tmp_path / "cores.json")}
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.split() == ["(0,)", "[0]", "1", "1", "1"]


def test_pinning_and_raynode_do_not_load_ray():
    script = ("import sys, cluster.pinning, cluster.raynode\n"
              "print(sorted(m for m in sys.modules if m == 'ray' or m.startswith('ray.')))")
    proc = subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "[]"


def test_required_pinning_needs_whole_cores_in_the_config():
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match=r"pin='required' with num_cpus=0.5: a pinned "
                                              r"replica takes whole cores; raise num_cpus"):
        ReplicaConfig(num_cpus=0.5, pin="required")
    with pytest.raises(ValidationError, match="'auto', 'required' or 'off'"):
        ReplicaConfig(pin="always")


def test_torch_threads_is_none_while_another_thread_is_still_importing_torch(monkeypatch):
    import sys
    import types

    from cluster.pinning import torch_threads

    # An in-process replica's info() can run while another replica's thread imports torch:
    # the module is in sys.modules but not yet filled in.
    monkeypatch.setitem(sys.modules, "torch", types.ModuleType("torch"))
    assert torch_threads() is None
    monkeypatch.setitem(sys.modules, "torch", types.SimpleNamespace(get_num_threads=lambda: 3))
    assert torch_threads() == 3
