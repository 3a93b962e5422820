"""`raybatch topology`: the machine and the plan, as text and as JSON; exit 2 when it cannot fit."""

from __future__ import annotations

import json
import os

import pytest

from raybatch.main import main
from tests.unit.cluster.sysfs_fixtures import NODE0, NODE1


def run_json(capsys, *argv: str) -> dict:
    assert main(["topology", "--json", *argv]) == 0
    return json.loads(capsys.readouterr().out)


def test_json_of_the_two_socket_box(two_socket, capsys):
    out = run_json(capsys, "--sysfs-root", str(two_socket.root), "--replicas", "2",
                   "--cores-per-replica", "2")
    assert [(n["id"], n["cpus"]) for n in out["numa_nodes"]] == [(0, sorted(NODE0)),
                                                                 (1, sorted(NODE1))]
    assert out["gpus"] == []
    assert out["plan"]["batcher"] == [0, 16]
    assert out["plan"]["replicas"] == [
        {"numa_node": 0, "cpus": [1, 2, 17, 18], "num_cores": 2, "gpu": None},
        {"numa_node": 0, "cpus": [3, 4, 19, 20], "num_cores": 2, "gpu": None}]


def test_defaults_fill_the_machine_and_every_gpu(four_gpu, capsys):
    out = run_json(capsys, "--sysfs-root", str(four_gpu.root), "--cores-per-replica", "2")
    replicas = out["plan"]["replicas"]
    assert [r["gpu"] for r in replicas] == [0, 1, 2, 3, None, None, None, None, None]
    assert [g["numa_node"] for g in out["gpus"]] == [0, 0, 1, 1]
    given = out["plan"]["batcher"] + [c for r in replicas for c in r["cpus"]]
    assert len(given) == len(set(given)) == 30  # 1 + 4 + 5 × 2 cores; one core left over


def test_text_shows_machine_and_plan(two_socket, capsys):
    assert main(["topology", "--sysfs-root", str(two_socket.root), "--replicas", "4",
                 "--cores-per-replica", "2"]) == 0
    out = capsys.readouterr().out
    assert out.splitlines() == [
        "machine: 2 NUMA nodes, 16 physical cores, 32 CPUs usable; core speed from "
        "cpufreq/cpuinfo_max_freq",
        "  node 0: CPUs 0-7,16-23 (8 cores)",
        "  node 1: CPUs 8-15,24-31 (8 cores)",
        "GPUs: none",
        "plan: batcher and 4 replicas",
        "  batcher    node 0  CPUs 0,16",
        "  replica 0  node 0  CPUs 1-2,17-18  (2 cores)",
        "  replica 1  node 0  CPUs 3-4,19-20  (2 cores)",
        "  replica 2  node 0  CPUs 5-6,21-22  (2 cores)",
        "  replica 3  node 1  CPUs 8-9,24-25  (2 cores)",
    ]


def test_text_names_gpus_and_notes(four_gpu, capsys):
    root = four_gpu.cpuset("0-7,16-23").root
    assert main(["topology", "--sysfs-root", str(root), "--replicas", "0"]) == 0
    out = capsys.readouterr().out
    assert "  GPU 2: 0000:b1:00.0 NVIDIA 0x2330, NUMA node 1, local CPUs none usable\n" in out
    assert "  replica 2  node 0  CPUs 3,19  (1 core)  GPU 2\n" in out
    assert "note: GPU 2 (0000:b1:00.0, NUMA node 1) has fewer than 1 free local core" in out


def test_out_of_cores_exits_2_with_the_reason(container, capsys):
    assert main(["topology", "--sysfs-root", str(container.root), "--replicas", "4"]) == 2
    captured = capsys.readouterr()
    assert captured.out.startswith("machine: 2 NUMA nodes, 4 physical cores, 8 CPUs usable")
    assert captured.err.startswith("raybatch topology: asked for 5 physical cores")
    assert "ask for at most 3 replicas of 1 core" in captured.err


def test_out_of_cores_as_json_prints_no_json(container, capsys):
    argv = ["topology", "--json", "--sysfs-root", str(container.root), "--gpu-replicas", "1"]
    assert main(argv) == 2
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "asked for 1 GPU replica (one per GPU) but this machine shows 0 GPUs" in captured.err


def test_a_root_that_is_not_sysfs_exits_2(tmp_path, capsys):
    assert main(["topology", "--sysfs-root", str(tmp_path)]) == 2
    assert "devices/system/cpu does not exist" in capsys.readouterr().err


def test_counts_are_checked_by_the_parser(capsys):
    with pytest.raises(SystemExit) as e:
        main(["topology", "--cores-per-replica", "0"])
    assert e.value.code == 2
    assert "--cores-per-replica: '0': give an integer above 0" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["topology", "--replicas", "abc"])
    assert "--replicas: 'abc': give an integer 0 or more" in capsys.readouterr().err


@pytest.mark.skipif(not os.path.isdir("/sys/devices/system/cpu"), reason="needs Linux sysfs")
def test_this_machine(capsys):
    out = run_json(capsys)
    cpus = [c for n in out["numa_nodes"] for c in n["cpus"]]
    assert cpus and set(cpus) <= os.sched_getaffinity(0)
    plan = out["plan"]
    given = plan["batcher"] + [c for r in plan["replicas"] for c in r["cpus"]]
    assert len(given) == len(set(given)) and set(given) <= set(cpus)
