"""Autoscaling proven on one machine: Ray's autoscaler (v2, as the manifests ask) adds a node
of the worker type read from a rendered RayService when the replica pool outgrows the
head, the new replica pins there, and the idle node is removed after the load.

The cluster runs in a subprocess (`k8s_autoscaling_scenario.py`): a driver joins one
cluster only, and this session's shared Ray is separate. It needs CPUs 0 and 1.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.integration.k8s_autoscaling_scenario import naming

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.own_ray]


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity") or not {0, 1} <= os.sched_getaffinity(0),
                    reason="needs CPUs 0 and 1 to pin to")
def test_a_pending_replica_brings_a_node_that_goes_away_when_idle(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    proc = subprocess.run([sys.executable, "-m", "tests.integration.k8s_autoscaling_scenario",
                           str(tmp_path)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=240)
    events = [json.loads(ln.removeprefix("EVENT ")) for ln in proc.stdout.splitlines()
              if ln.startswith("EVENT ")]
    lines = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")]
    assert proc.returncode == 0 and lines, (events, proc.stdout[-2000:], proc.stderr[-4000:])
    result = json.loads(lines[-1].removeprefix("RESULT "))
    assert [e["event"] for e in events] == ["cluster up", "deployed", "scaled up",
                                           "pool scaled down", "node removed"], events

    # The autoscaler added one node, of the type the rendered manifest describes.
    (head,) = result["head_nodes"]
    (added,) = result["added_nodes"]
    worker_type = result["worker_type"]
    assert worker_type["resources"]["numa0"] == 1 and worker_type["resources"]["CPU"] == 1
    for key in ("CPU", "numa0"):
        assert result["new_node_resources"][key] == worker_type["resources"][key]
    assert worker_type["labels"].items() <= result["new_node_labels"].items()
    assert worker_type["labels"]["raybatch.io/cores"] == "1"

    # The pool's second replica went there and pinned itself to the core left free.
    replicas = {r["node_id"]: r for r in result["replicas"]}
    assert sorted(replicas) == sorted([head, added]), result["replicas"]
    for node, cpu in ((head, 0), (added, 1)):
        r = replicas[node]
        assert r["state"] == "ALIVE" and r["pinned"] and r["numa_node"] == 0, r
        assert r["cpus"] == r["pinned_cpus"] == [cpu], r  # as the actor reads its affinity
    assert replicas[added]["index"] > replicas[head]["index"]

    # After the load: the newest replica was removed, its node idled and went away.
    assert result["alive_after"] == [head]
    assert result["after"] == [8.0] and result["answered"] >= 16

    # and nothing of the cluster outlived the scenario (a removed node's log monitor once did)
    (session,) = [ln.removeprefix("SESSION ") for ln in proc.stdout.splitlines()
                  if ln.startswith("SESSION ")]
    left = [" ".join(p.info["cmdline"] or []) for p in naming(session)]
    assert not left, left
