"""A two-node Ray cluster on this machine: replicas land on the node whose NUMA resource
they asked for and pin to that node's CPU (read back inside the actor); a replica on the
other node takes its batches on a direct connection to that node's address. Replicas of
a model that asks for no node spread one per node; a batching actor and the ingress
placed by a custom resource run on the node that has it; `raybatch status` says where.

The cluster runs in a subprocess (`multinode_scenario.py`): a driver joins one
cluster only, and this session's shared Ray is already joined. It needs CPUs 0 and 1.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = [pytest.mark.integration, pytest.mark.own_ray]


PINNABLE = hasattr(os, "sched_getaffinity") and {0, 1} <= os.sched_getaffinity(0)


@pytest.fixture(scope="module")
def result(tmp_path_factory) -> dict:
    """The scenario's report (it runs once for the tests of this module)."""
    if not PINNABLE:
        pytest.skip("needs CPUs 0 and 1 to pin to")
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.run([sys.executable, "-m", "tests.integration.multinode_scenario",
                           str(tmp_path_factory.mktemp("multinode"))], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=240)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, (proc.stdout[-2000:], proc.stderr[-4000:])
    return json.loads(lines[-1].removeprefix("RESULT "))


def numa_nodes(result: dict) -> dict[str, str]:
    """{"numa0": the head's node id, "numa1": the worker's}."""
    return {sorted(r)[0]: node for node, r in result["nodes"].items()}


def test_replicas_land_on_their_numa_nodes_and_pin_to_its_cpus(result):
    node_of = numa_nodes(result)
    assert sorted(node_of) == ["numa0", "numa1"] and len(set(node_of.values())) == 2

    replicas = sorted(result["replicas"], key=lambda r: r["numa_node"])
    assert [r["state"] for r in replicas] == ["ALIVE", "ALIVE"]
    assert [r["numa_node"] for r in replicas] == [0, 1]  # one per node, not both on numa0
    for n, r in enumerate(replicas):
        assert r["node_id"] == node_of[f"numa{n}"], r
        assert r["pinned"] and r["cpus"] == r["pinned_cpus"] == [n], r  # as the actor sees it
        assert r["torch_threads"] == 1
    assert len({r["pid"] for r in replicas}) == 2
    assert result["squared"] == [9.0, 4.0, 4.0]
    # a replica on the other node, fed from the head: every answer right, and once the
    # direct connection opened, batches on it, to that node's address (not 127.0.0.1)
    sent = len(result["far"])
    assert sent >= 20 and result["far"] == [float(x * x) for x in range(sent)]
    far = result["far_replica"]
    assert far["node_id"] == node_of["numa1"] and far["read_ahead"], far
    assert far["link_batches"] >= 10 and far["link_hosts"] == [result["head_ip"]], far
    for n in (0, 1):
        assert re.search(rf"^  replica-\d+: ALIVE, node \w+ cpus \[{n}\] numa {n} pinned gpus",
                         result["status_text"], re.M), result["status_text"]


def test_replicas_spread_one_per_node_and_actors_run_where_their_resource_is(result):
    head, worker = numa_nodes(result)["numa0"], numa_nodes(result)["numa1"]
    for model, s in result["spread"].items():
        replicas = s["replica_info"]
        assert [r["state"] for r in replicas] == ["ALIVE", "ALIVE"], (model, replicas)
        # no pinning, no resources: one replica per node, not both where the engine runs
        assert sorted(r["node_id"] for r in replicas) == sorted([head, worker]), (model, replicas)
        assert all(r["node_ip"] for r in replicas), replicas
        # the models' one batching actor asks `back`, which only the worker has
        [batcher] = s["batching_actors"]
        assert (batcher["name"], batcher["state"], batcher["node_id"]) == (
            "batcher-group-spread", "ALIVE", worker), batcher
        # the ingress asks `front`, which only the head has
        assert [r["node_id"] for r in s["ingress_replicas"]] == [head], s["ingress_replicas"]
    text = result["status_text"]
    assert re.search(rf"^  batching actor batcher-group-spread: ALIVE, node {worker[:8]} "
                     rf"\(host [\d.]+\)$", text, re.M), text
    assert re.search(rf"^ingress: 1 replicas\n  \S+#Ingress#\S+: ALIVE, node {head[:8]} ",
                     text, re.M), text
