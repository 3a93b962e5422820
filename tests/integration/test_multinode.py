"""A two-node Ray cluster on this machine: replicas land on the node whose NUMA resource
they asked for and pin to that node's CPU (read back inside the actor); a replica on the
other node takes its batches on a direct connection to that node's address.

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


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or not {0, 1} <= os.sched_getaffinity(0),
                    reason="needs CPUs 0 and 1 to pin to")
def test_replicas_land_on_their_numa_nodes_and_pin_to_its_cpus(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.run([sys.executable, "-m", "tests.integration.multinode_scenario",
                           str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=150)
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, (proc.stdout[-2000:], proc.stderr[-4000:])
    result = json.loads(lines[-1].removeprefix("RESULT "))
    node_of = {resources[0]: node for node, resources in result["nodes"].items()}
    assert sorted(node_of) == ["numa0", "numa1"] and len(set(node_of.values())) == 2

    replicas = sorted(result["replicas"], key=lambda r: r["numa_node"])
    assert [r["state"] for r in replicas] == ["ALIVE", "ALIVE"]
    assert [r["numa_node"] for r in replicas] == [0, 1]  # one per node, not both on numa0
    for n, r in enumerate(replicas):
        assert r["node_id"] == node_of[f"numa{n}"], r
        assert r["pinned"] and r["cpus"] == r["pinned_cpus"] == [n], r  # as the actor sees it
        assert r["torch_threads"] == 1
    assert len({r["pid"] for r in replicas}) == 2
    assert result["squared"] == [9.0]
    # a replica on the other node, fed from the head: every answer right, the batches after
    # the first on the direct connection to that node's address (not 127.0.0.1)
    assert result["far"] == [float(x * x) for x in range(20)]
    far = result["far_replica"]
    assert far["node_id"] == node_of["numa1"] and far["read_ahead"], far
    assert far["link_batches"] >= 10 and far["link_hosts"] == [result["head_ip"]], far
    for n in (0, 1):
        assert re.search(rf"^  replica-\d+: ALIVE, node \w+ cpus \[{n}\] numa {n} pinned gpus",
                         result["status_text"], re.M), result["status_text"]
