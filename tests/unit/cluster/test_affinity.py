"""The affinity plan on fake machines: whole cores, primary node first, GPU locality, no overlap."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from cluster.affinity import AffinityPlan, PlacementError, max_replicas, plan_affinity
from cluster.topology import Core, Gpu, NumaNode, Topology, discover


def all_cpus(plan: AffinityPlan) -> list[int]:
    return [*plan.batcher, *(c for r in plan.replicas for c in r.cpus)]


def assert_whole_cores_given_once(topo: Topology, plan: AffinityPlan) -> None:
    given = all_cpus(plan)
    assert len(given) == len(set(given)), f"a CPU is given twice: {sorted(given)}"
    for cpus, k in [(plan.batcher, None), *((r.cpus, r.num_cores) for r in plan.replicas)]:
        cores = [core for core in topo.cores if set(core.cpus) & set(cpus)]
        assert sorted(c for core in cores for c in core.cpus) == sorted(cpus), \
            f"{cpus} splits a core's siblings"
        assert k is None or len(cores) == k


def test_two_socket_fills_the_primary_node_first_with_whole_cores(two_socket):
    topo = discover(two_socket.root)
    plan = plan_affinity(topo, replicas=7, cores_per_replica=2)
    assert (plan.batcher, plan.batcher_node) == ((0, 16), 0)
    assert [(r.numa_node, r.cpus) for r in plan.replicas] == [
        (0, (1, 2, 17, 18)), (0, (3, 4, 19, 20)), (0, (5, 6, 21, 22)),
        (1, (8, 9, 24, 25)), (1, (10, 11, 26, 27)), (1, (12, 13, 28, 29)),
        (1, (14, 15, 30, 31))]
    assert all(r.gpu is None and r.num_cores == 2 for r in plan.replicas)
    assert_whole_cores_given_once(topo, plan)
    assert set(range(32)) - set(all_cpus(plan)) == {7, 23}  # one core left on node 0
    assert plan.notes == ()


def test_a_replica_moves_to_another_node_rather_than_span(two_socket):
    plan = plan_affinity(discover(two_socket.root), replicas=3, cores_per_replica=5)
    first, second, third = plan.replicas
    assert first.numa_node == 0 and first.cpus == (1, 2, 3, 4, 5, 17, 18, 19, 20, 21)
    # node 0 has 2 cores left: the second replica goes whole to node 1
    assert second.numa_node == 1 and second.cpus == (8, 9, 10, 11, 12, 24, 25, 26, 27, 28)
    # 2 + 3 cores left, none of the nodes holds 5: only now does a replica span
    assert third.numa_node is None and sorted(third.cpus) == [6, 7, 13, 14, 15, 22, 23, 29, 30,
                                                              31]
    assert plan.notes == ("replica 2 spans NUMA nodes 0, 1: no node had 5 free cores",)


def test_a_spanning_replica_uses_as_few_nodes_as_it_can(fake_sysfs):
    fake_sysfs.cpus([(c,) for c in range(7)]).numa({0: [0, 1], 1: [2, 3], 2: [4, 5, 6]})
    plan = plan_affinity(discover(fake_sysfs.root), replicas=1, cores_per_replica=5)
    # Free after the batcher: node 0 one core, node 1 two, node 2 three: nodes 2 and 1 suffice.
    assert plan.batcher == (0,) and plan.replicas[0].cpus == (2, 3, 4, 5, 6)


def test_primary_node_is_the_node_of_the_fastest_core(two_socket):
    perf = dict.fromkeys(range(32), 100) | {9: 110, 25: 110}
    topo = discover(two_socket.speed("acpi_cppc/highest_perf", perf).root)
    assert topo.primary_node.id == 1
    plan = plan_affinity(topo, replicas=5, cores_per_replica=2)
    assert (plan.batcher, plan.batcher_node) == ((9, 25), 1)
    assert [r.numa_node for r in plan.replicas] == [1, 1, 1, 0, 0]
    assert plan.replicas[0].cpus == (8, 10, 24, 26)


def test_other_nodes_follow_by_their_best_core(fake_sysfs):
    fake_sysfs.cpus([(c,) for c in range(6)]).numa({0: [0, 1], 1: [2, 3], 2: [4, 5]})
    fake_sysfs.speed("cpu_capacity", {0: 1024, 1: 900, 2: 600, 3: 600, 4: 800, 5: 800})
    plan = plan_affinity(discover(fake_sysfs.root), replicas=2, cores_per_replica=2)
    assert plan.batcher == (0,)
    assert [(r.numa_node, r.cpus) for r in plan.replicas] == [(2, (4, 5)), (1, (2, 3))]


def test_hybrid_batcher_gets_the_fastest_p_core_and_e_cores_go_last(hybrid):
    topo = discover(hybrid.root)
    assert plan_affinity(topo, batcher_cores=2).batcher == (4, 5, 10, 11)
    plan = plan_affinity(topo, replicas=14)
    assert plan.batcher == (4, 5)
    assert [r.cpus for r in plan.replicas] == [
        (10, 11), (0, 1), (2, 3), (6, 7), (8, 9), (12, 13), (14, 15),
        *((c,) for c in range(16, 23))]
    assert_whole_cores_given_once(topo, plan)


def test_container_plans_within_its_cpuset(container):
    topo = discover(container.root)
    plan = plan_affinity(topo, replicas=3)
    assert plan.batcher == (6, 22)
    assert [(r.numa_node, r.cpus) for r in plan.replicas] == [
        (0, (7, 23)), (1, (8, 24)), (1, (9, 25))]
    # Two cores per replica: node 0 has one left, so the replica goes whole to node 1.
    two = plan_affinity(topo, replicas=1, cores_per_replica=2).replicas[0]
    assert (two.numa_node, two.cpus) == (1, (8, 9, 24, 25))


def test_container_out_of_cores_says_what_fits(container):
    with pytest.raises(PlacementError) as e:
        plan_affinity(discover(container.root), replicas=4)
    assert str(e.value) == (
        "asked for 5 physical cores (1 core for the batcher, 4 CPU replicas × 1) but 4 are "
        "usable here (8 CPUs, 2 NUMA nodes); 3 cores are left for CPU replicas: ask for at "
        "most 3 replicas of 1 core, or allow this process more cores (its cgroup cpuset or "
        "affinity)")


def test_out_of_cores_suggests_fewer_replicas_or_smaller_ones(two_socket):
    with pytest.raises(PlacementError, match=r"asked for 17 physical cores .* but 16 are usable"
                       r".*15 cores are left.*at most 3 replicas of 4 cores, give each of the "
                       r"4 replicas 3 cores"):
        plan_affinity(discover(two_socket.root), replicas=4, cores_per_replica=4)


def test_out_of_cores_for_the_batcher_and_gpus_alone(four_gpu):
    with pytest.raises(PlacementError, match=r"batcher and GPU replicas alone need 17"):
        plan_affinity(discover(four_gpu.root), gpu_replicas=4, cores_per_gpu_replica=4)


def test_gpu_replicas_get_cores_local_to_their_gpu(four_gpu):
    topo = discover(four_gpu.root)
    plan = plan_affinity(topo, gpu_replicas=4, cores_per_gpu_replica=2, replicas=7)
    gpu_replicas, cpu_replicas = plan.replicas[:4], plan.replicas[4:]
    assert [r.gpu for r in gpu_replicas] == [0, 1, 2, 3]
    for r in gpu_replicas:
        gpu = topo.gpus[r.gpu]
        assert r.numa_node == gpu.numa_node and set(r.cpus) <= set(gpu.local_cpus)
    assert [r.cpus for r in gpu_replicas] == [
        (1, 2, 17, 18), (3, 4, 19, 20), (8, 9, 24, 25), (10, 11, 26, 27)]
    assert [r.gpu for r in cpu_replicas] == [None] * 7
    assert_whole_cores_given_once(topo, plan)
    assert sorted(all_cpus(plan)) == list(range(32))  # the box is exactly full


def test_a_gpu_with_no_free_local_cores_gets_the_nearest_with_a_note(four_gpu):
    topo = discover(four_gpu.cpuset("0-7,16-23").root)  # the container sees node 0 only
    plan = plan_affinity(topo, gpu_replicas=4)
    assert [r.cpus for r in plan.replicas] == [(1, 17), (2, 18), (3, 19), (4, 20)]
    assert len(plan.notes) == 2 and plan.notes[0].startswith(
        "GPU 2 (0000:b1:00.0, NUMA node 1) has fewer than 1 free local core (local CPUs "
        "none usable); its replica got CPUs 3,19")


def test_a_gpu_short_of_local_cores_stays_on_its_node(two_socket):
    topo = discover(two_socket.gpu("0000:b1:00.0", 1, [9, 25]).root)  # one local core
    plan = plan_affinity(topo, gpu_replicas=1, cores_per_gpu_replica=2)
    (r,) = plan.replicas
    assert (r.gpu, r.numa_node, r.cpus) == (0, 1, (8, 9, 24, 25))
    assert "fewer than 2 free local cores (local CPUs 9,25)" in plan.notes[0]


def test_more_gpu_replicas_than_gpus(four_gpu):
    with pytest.raises(PlacementError, match=r"asked for 5 GPU replicas .* shows 4 GPUs "
                                             r"\(0000:17:00.0, .*\): ask for at most 4"):
        plan_affinity(discover(four_gpu.root), gpu_replicas=5)


def test_an_unpinned_batcher_leaves_every_core_to_replicas(two_socket):
    plan = plan_affinity(discover(two_socket.root), replicas=16, batcher_cores=0)
    assert (plan.batcher, plan.batcher_node) == ((), None)
    assert plan.replicas[0].cpus == (0, 16) and len(plan.replicas) == 16


def test_the_same_machine_gives_the_same_plan(four_gpu):
    plans = [plan_affinity(discover(four_gpu.root), replicas=3, cores_per_replica=3,
                           gpu_replicas=2) for _ in range(2)]
    assert plans[0] == plans[1]
    assert plans[0].to_dict()["replicas"][0] == {"numa_node": 0, "cpus": [1, 17], "num_cores": 1,
                                                 "gpu": 0}


def test_max_replicas(four_gpu, no_numa):
    topo = discover(four_gpu.root)
    assert max_replicas(topo, cores_per_replica=2) == 7
    assert max_replicas(topo, cores_per_replica=2, gpu_replicas=4) == 5
    assert max_replicas(discover(no_numa.root)) == 2


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"cores_per_replica": 0}, "cores_per_replica=0 must be >= 1"),
    ({"replicas": -1}, "replicas=-1 must be >= 0"),
    ({"batcher_cores": -1}, "batcher_cores=-1 must be >= 0"),
])
def test_malformed_requests(two_socket, kwargs, message):
    with pytest.raises(ValueError, match=message):
        plan_affinity(discover(two_socket.root), **kwargs)


@st.composite
def machines(draw) -> Topology:
    """1-3 nodes of 1-6 cores, each core 1-2 SMT siblings and a random speed; 0-2 GPUs."""
    nodes, cpu = [], 0
    for n in range(draw(st.integers(1, 3))):
        cores = []
        for _ in range(draw(st.integers(1, 6))):
            width = draw(st.integers(1, 2))
            cores.append(Core(tuple(range(cpu, cpu + width)), n, draw(st.integers(1, 3))))
            cpu += width
        nodes.append(NumaNode(n, tuple(sorted(cores, key=lambda c: (-c.speed, c.cpus[0])))))
    gpus = tuple(Gpu(i, f"0000:{i:02x}:00.0", node.id, node.cpus)
                 for i, node in enumerate(draw(st.lists(st.sampled_from(nodes), max_size=2))))
    return Topology(tuple(nodes), gpus)


@given(machines(), st.integers(0, 8), st.integers(1, 4), st.integers(0, 2), st.integers(1, 2),
       st.integers(0, 2))
def test_any_plan_fits_or_says_it_does_not(topo, replicas, k, gpus, k_gpu, batcher):
    gpus = min(gpus, len(topo.gpus))
    asked = batcher + gpus * k_gpu + replicas * k
    try:
        plan = plan_affinity(topo, replicas=replicas, cores_per_replica=k, gpu_replicas=gpus,
                             cores_per_gpu_replica=k_gpu, batcher_cores=batcher)
    except PlacementError as e:
        assert asked > len(topo.cores), f"{e} although {asked} <= {len(topo.cores)} cores"
        assert f"asked for {asked} physical cores" in str(e)
        return
    assert len(plan.replicas) == gpus + replicas
    assert_whole_cores_given_once(topo, plan)
    # Replay the free cores per node: a replica spans nodes only when no node had k free.
    free = {n.id: len(n.cores) for n in topo.nodes}
    for cpus, r in [(plan.batcher, None), *((r.cpus, r) for r in plan.replicas)]:
        if r is not None and r.numa_node is None and r.gpu is None:
            assert max(free.values()) < r.num_cores, f"{r} spans although a node had room"
        if r is not None and r.gpu is not None and free[topo.gpus[r.gpu].numa_node] >= r.num_cores:
            assert r.numa_node == topo.gpus[r.gpu].numa_node, f"{r} is not local to its GPU"
            assert set(r.cpus) <= set(topo.gpus[r.gpu].local_cpus)
        for core in topo.cores:
            if core.cpus[0] in cpus:
                free[core.node] -= 1
