"""Two Ray nodes on this machine, each advertising one NUMA node; where do replicas land?

Run by `test_multinode.py` in a process of its own (a driver joins one cluster only,
and the test session already has its shared Ray):

    python -m tests.integration.multinode_scenario WORKDIR

A fake sysfs tree in WORKDIR describes this machine as two NUMA nodes, CPU 0 and
CPU 1, so pinning really happens. The head node advertises `numa0: 1`, the other
node `numa1: 1` (as `raybatch join` would for two one-core machines). A model with
two pinned replicas of one core each is deployed; the pool must send one replica to
each node (back to back, before Ray counts the first), and each replica must pin
to its node's CPU. Two more models (`SPREAD`, sharing one batching actor), with two
unpinned replicas each and no placement of their own, must get one replica on each node
(`replicas.spread`); their batching actor asks for a resource only the other node has,
the ingress for one only the head has, and each must run there. Prints one line,
`RESULT {json}`: the nodes, the replicas as `raybatch status --json` reports them (read
back inside each actor), and the text of `raybatch status`.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[2]
APP = "raybatch-multinode"
SPREAD = ("spread-a", "spread-b")
TENSORS = {"inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1]}],
           "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1]}]}


def fake_sysfs(root: Path) -> None:
    """CPUs 0 and 1 of this machine, one per NUMA node, no SMT."""
    for cpu in (0, 1):
        topo = root / f"devices/system/cpu/cpu{cpu}/topology"
        topo.mkdir(parents=True)
        (topo / "thread_siblings_list").write_text(f"{cpu}\n")
        node = root / f"devices/system/node/node{cpu}"
        node.mkdir(parents=True)
        (node / "cpulist").write_text(f"{cpu}\n")
    (root / "devices/system/cpu/online").write_text("0-1\n")


def config(env: dict[str, str]):
    from cluster.config import load_config

    spread = [{"name": name, "transformer": "deployments.models:Square", **TENSORS,
               # one batching actor for both, placed on the worker by its resource
               "batcher": {"placement": "actor", "group": "spread", "resources": {"back": 0.01}},
               "replicas": {"min_replicas": 2, "max_replicas": 2, "num_cpus": 0.25,
                            "pin": "off", "env": env}} for name in SPREAD]
    return load_config({
        "app_name": APP,
        "ingress": {"num_cpus": 0, "route_prefix": "/multinode", "resources": {"front": 0.01}},
        "models": [*spread, {
            "name": "square", "transformer": "deployments.models:Square",
            "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1]}],
            "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1]}],
            "batcher": {"num_cpus": 0},
            "replicas": {"min_replicas": 2, "max_replicas": 2, "num_cpus": 1,
                         "pin": "required", "env": env},
        }],
    })


def far_config():
    """A model whose replica reads ahead and must run on the other node (resource `far`)."""
    from cluster.config import ModelConfig

    return ModelConfig.model_validate({
        "name": "far", "transformer": "deployments.models:Square",
        "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1]}],
        "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1]}],
        "replicas": {"num_cpus": 0, "read_ahead": True, "resources": {"far": 1}}})


FAR_GIVE_UP_S = 120.0


async def far_batches() -> tuple[list, dict]:
    """Batches from this process (an engine on the head node) to a replica on the other
    node, of 0, 1, 2, ... in turn: the first as Ray calls while the direct connection opens
    (in the background: on a busy machine that took more than 20 batches), the rest on it;
    sent until 10 went on it (at most for FAR_GIVE_UP_S, a bound against a hang). Returns
    every answer and the replica's own account."""
    from deployments.replica.pool import ReplicaPool

    _, client = ReplicaPool(far_config(), host=None)._create()
    try:
        info = await client.info()
        out: list = []
        give_up = time.monotonic() + FAR_GIVE_UP_S
        while len(out) < 20 or (info["link_batches"] < 10 and time.monotonic() < give_up):
            values, _ = await client.run(np.array([len(out)], np.float32))
            out += np.asarray(values).tolist()
            if len(out) >= 20:
                info = await client.info()
        return out, info
    finally:
        client.stop()


def status(address: str, *flags: str) -> str:
    """`raybatch status`, as a user would run it."""
    proc = subprocess.run([sys.executable, "-m", "raybatch", "status", "--address", address,
                           "--app", APP, *flags], cwd=ROOT, capture_output=True, text=True,
                          timeout=60)
    if proc.returncode != 0:
        raise RuntimeError(f"raybatch status failed: {proc.stderr[-2000:]}")
    return proc.stdout


def note(what: str) -> None:
    print(f"note: {what}", file=sys.stderr, flush=True)  # stdout is the test's to read


def main(workdir: Path) -> None:
    import ray
    from ray import serve
    from ray.cluster_utils import Cluster

    from cluster.localray import start_local
    from cluster.pinning import CORES_FILE_ENV, SYSFS_ROOT_ENV
    from deployments.app import build_app

    fake_sysfs(workdir / "sys")
    env = {SYSFS_ROOT_ENV: str(workdir / "sys"), CORES_FILE_ENV: str(workdir / "cores.json")}
    os.environ.update(env)
    os.chdir(ROOT)  # workers put the driver's directory on sys.path
    # each node started as `raybatch up` starts its own: again if it missed Ray's fixed waits
    cluster = start_local(lambda: Cluster(initialize_head=True, head_node_args={
        "num_cpus": 3, "resources": {"numa0": 1, "front": 1}, "include_dashboard": False,
        "labels": {"raybatch.io/primary-numa": "0"}}), say=note)
    try:
        start_local(lambda: cluster.add_node(
            num_cpus=2, resources={"numa1": 1, "far": 1, "back": 1},
            labels={"raybatch.io/primary-numa": "1"}), say=note)
        ray.init(address=cluster.address, log_to_driver=False)
        nodes = {n["NodeID"]: sorted(k for k in n["Resources"] if k.startswith("numa"))
                 for n in ray.nodes() if n["Alive"]}
        serve.start(proxy_location="Disabled")  # the handle is enough: no port to clash
        handle = serve.run(build_app(config(env)), name=APP, route_prefix="/multinode")
        out = handle.infer.remote("square", {"INPUT0": np.array([3.0], np.float32)})
        squared = out.result(timeout_s=60)["OUTPUT0"].tolist()
        for name in SPREAD:  # every model answers
            out = handle.infer.remote(name, {"INPUT0": np.array([2.0], np.float32)})
            squared += out.result(timeout_s=60)["OUTPUT0"].tolist()
        stats = json.loads(status(cluster.address, "--json"))
        replicas = stats["square"]["replica_info"]
        far, far_info = asyncio.run(far_batches())
        print("RESULT " + json.dumps({"nodes": nodes, "replicas": replicas, "squared": squared,
                                      "spread": {m: stats[m] for m in SPREAD},
                                      "far": far, "far_replica": far_info,
                                      "head_ip": ray.util.get_node_ip_address(),
                                      "status_text": status(cluster.address)}), flush=True)
        serve.shutdown()
    finally:
        ray.shutdown()
        cluster.shutdown()


if __name__ == "__main__":
    main(Path(sys.argv[1]))
