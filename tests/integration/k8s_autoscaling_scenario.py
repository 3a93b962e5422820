"""Autoscaling as KubeRay runs it, on one machine: Ray's autoscaler with a fake node provider.

Run by `test_k8s_autoscaling.py` in a process of its own (a driver joins one cluster,
and the test session has its own Ray):

    python -m tests.integration.k8s_autoscaling_scenario WORKDIR

The worker node type is not written here: a config is rendered by `raybatch render
k8s`, and Ray's own KubeRay translator (what the autoscaler in the head pod runs)
turns the RayService's cluster spec into the autoscaler config. Only the provider is
swapped for Ray's fake multi-node one (nodes are raylets on this machine, started
and stopped by the autoscaler), and the node type's `memory` dropped (a fake node
cannot take it). The head stands in for the first worker pod (it holds one replica:
CPU 1, numa0 1), so the worker type starts at 0 nodes.

A fake sysfs tree describes this machine as one NUMA node of CPUs 0 and 1, so
replicas really pin. A `sleep` model (100 ms a batch of one) gets load: its pool asks
for a second replica, which no node has room for; the autoscaler adds a worker; the
replica starts and pins there. The load stops; the pool removes its newest replica;
the node idles and the autoscaler removes it. Prints `EVENT {json}` lines as it goes
and one `RESULT {json}` line at the end.
"""

from __future__ import annotations

import asyncio
import copy
import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import yaml

ROOT = Path(__file__).resolve().parents[2]
APP = "raybatch-k8s-autoscaling"
GROUP = "cpu"
IDLE_TIMEOUT_S = 5
FAKE_PROVIDER = "ray.autoscaler._private.fake_multi_node.node_provider.FakeMultiNodeProvider"
T0 = time.monotonic()


def event(name: str, **data: Any) -> None:
    print("EVENT " + json.dumps({"t_s": round(time.monotonic() - T0, 1), "event": name,
                                 **data}), flush=True)


def fake_sysfs(root: Path) -> None:
    """CPUs 0 and 1 of this machine, one NUMA node, no SMT."""
    for cpu in (0, 1):
        topo = root / f"devices/system/cpu/cpu{cpu}/topology"
        topo.mkdir(parents=True)
        (topo / "thread_siblings_list").write_text(f"{cpu}\n")
    (root / "devices/system/cpu/online").write_text("0-1\n")
    node = root / "devices/system/node/node0"
    node.mkdir(parents=True)
    (node / "cpulist").write_text("0-1\n")


def config(env: dict[str, str]):
    from cluster.config import load_config

    return load_config({
        "app_name": APP,
        "ingress": {"num_cpus": 0, "route_prefix": "/k8s"},
        "models": [{
            "name": "sleep", "transformer": "deployments.models:Sleep",
            "init_kwargs": {"base_ms": 100.0, "per_item_ms": 0.0},
            "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1]}],
            "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1]}],
            "batching": {"max_batch_size": 1, "max_queue_delay_s": 0},
            "batcher": {"num_cpus": 0},
            # 16 requests in flight at 100 ms each queue 1.6 s of work on one replica,
            # what must scale up: no bound, by time or count (on a loaded machine this
            # replica's batches were measured at 570 ms, and a 5 s bound refused them)
            "limits": {"max_queue_wait_s": None, "queue_batches": None},
            "replicas": {"min_replicas": 1, "max_replicas": 2, "num_cpus": 1,
                         "scale_up_queue_items": 2, "scale_down_idle_s": 1,
                         "pin": "required", "env": env},
        }],
        "kubernetes": {"cpu_workers": [{"name": GROUP, "cpus": 1, "memory": "1Gi"}],
                       "idle_timeout_s": IDLE_TIMEOUT_S},
    })


def autoscaler_config(rendered: dict[str, Any], gcs_address: str) -> dict[str, Any]:
    """What KubeRay's autoscaler makes of the rendered cluster, on the fake provider."""
    from ray.autoscaler._private.fake_multi_node.node_provider import FAKE_HEAD_NODE_ID
    from ray.autoscaler._private.kuberay.autoscaling_config import (
        _derive_autoscaling_config_from_ray_cr,
    )

    cluster = rendered["spec"]["rayClusterConfig"]
    derived = _derive_autoscaling_config_from_ray_cr(
        {"metadata": {"name": "raybatch", "namespace": "default"}, "spec": cluster})
    worker = copy.deepcopy(derived["available_node_types"][GROUP])
    worker["resources"].pop("memory", None)
    worker["resources"]["object_store_memory"] = 100 * 2**20
    worker.update(min_workers=0, max_workers=1)
    return {
        **derived,
        # `external`: Ray 2.60's wheel lacks the fake provider's defaults file (example.yaml)
        "provider": {"type": "external", "module": FAKE_PROVIDER, "use_node_id_as_ip": True,
                     "disable_node_updaters": True, "disable_launch_config_check": True,
                     "gcs_address": gcs_address, "launch_multiple": True,
                     "head_node_id": FAKE_HEAD_NODE_ID},
        "head_node_type": "ray.head.default",
        "available_node_types": {
            "ray.head.default": {"resources": {"CPU": 1, "numa0": 1}, "node_config": {},
                                 "max_workers": 0},
            GROUP: worker},
        "max_workers": 1,
    }


def status_json(address: str) -> dict[str, Any]:
    """`raybatch status --json`, as a user would run it."""
    proc = subprocess.run([sys.executable, "-m", "raybatch", "status", "--address",
                           address, "--app", APP, "--json"], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)
    if proc.returncode != 0:
        raise RuntimeError(f"raybatch status failed: {proc.stderr[-2000:]}")
    return json.loads(proc.stdout)["sleep"]


def alive_nodes() -> dict[str, dict[str, Any]]:
    import ray

    return {n["NodeID"]: n for n in ray.nodes() if n["Alive"]}


async def load_until(handle: Any, done: Any, timeout_s: float) -> int:
    """Keep ~16 requests in flight until `done()`; returns how many were answered."""
    answered, give_up = 0, time.monotonic() + timeout_s
    while not await done():
        if time.monotonic() > give_up:
            raise TimeoutError(f"no second replica placed within {timeout_s} s")
        calls = [handle.infer.remote("sleep", {"INPUT0": np.array([float(i)], np.float32)})
                 for i in range(16)]
        outs = await asyncio.gather(*calls)
        assert [float(o["OUTPUT0"][0]) for o in outs] == [2.0 * i for i in range(16)]
        answered += len(outs)
    return answered


async def under_load(handle: Any, fn: Any) -> Any:
    """`fn()` in a thread while ~16 requests stay in flight (so the pool keeps its replicas)."""
    stop = asyncio.Event()

    async def keep() -> None:
        while not stop.is_set():
            await asyncio.gather(*[handle.infer.remote(
                "sleep", {"INPUT0": np.array([1.0], np.float32)}) for _ in range(16)])

    task = asyncio.create_task(keep())
    try:
        return await asyncio.to_thread(fn)
    finally:
        stop.set()
        await task


def wait_for(check: Any, timeout_s: float, what: str) -> Any:
    give_up = time.monotonic() + timeout_s
    while not (value := check()):
        if time.monotonic() > give_up:
            raise TimeoutError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(0.5)
    return value


def run(workdir: Path) -> dict[str, Any]:
    import ray
    from ray import serve
    from ray.autoscaler._private.fake_multi_node.node_provider import FAKE_HEAD_NODE_ID
    from ray.cluster_utils import Cluster

    from cluster.k8s.manifests import RAYSERVICE_FILE, render
    from cluster.localray import start_local
    from cluster.pinning import CORES_FILE_ENV, SYSFS_ROOT_ENV
    from cluster.ports import free_port

    fake_sysfs(workdir / "sys")
    env = {SYSFS_ROOT_ENV: str(workdir / "sys"), CORES_FILE_ENV: str(workdir / "cores.json")}
    cfg = config(env)
    (rendered,) = render(cfg)[RAYSERVICE_FILE]
    port = free_port()
    ip = ray._private.services.get_node_ip_address()  # where the head's GCS listens
    scaling = autoscaler_config(rendered, f"{ip}:{port}")
    (workdir / "autoscaling.yaml").write_text(yaml.safe_dump(scaling))
    # The monitor (the autoscaler) and every node it starts inherit this environment.
    os.environ.update(env)
    os.environ.update({"RAY_FAKE_CLUSTER": "1", "AUTOSCALER_UPDATE_INTERVAL_S": "1",
                       "RAY_enable_autoscaler_v2": "1", "RAY_CLOUD_INSTANCE_ID": FAKE_HEAD_NODE_ID,
                       "RAY_OVERRIDE_NODE_ID_FOR_TESTING": FAKE_HEAD_NODE_ID})
    os.chdir(ROOT)  # workers put the driver's directory on sys.path
    # the head started as `raybatch up` starts its own: again if it missed Ray's fixed waits
    cluster = start_local(lambda: Cluster(initialize_head=True, head_node_args={
        "num_cpus": 1, "resources": {"numa0": 1}, "include_dashboard": False,
        "gcs_server_port": port,
        "labels": {"raybatch.io/primary-numa": "0"},
        "autoscaling_config": str(workdir / "autoscaling.yaml")}),
        say=lambda what: print(f"note: {what}", file=sys.stderr, flush=True))
    session = cluster.head_node.get_session_dir_path()
    print(f"SESSION {session}", flush=True)
    try:
        return scenario(cluster, cfg, scaling)
    finally:
        if ray.is_initialized():
            serve.shutdown()
        ray.shutdown()
        cluster.shutdown()
        end_leftovers(session)


def naming(session: str) -> list[Any]:
    """The processes (psutil) whose command line names this cluster's session dir."""
    import psutil

    return [p for p in psutil.process_iter(["cmdline"])
            if session in " ".join(p.info["cmdline"] or []) and p.pid != os.getpid()]


def end_leftovers(session: str) -> None:
    """Kill every process still naming this cluster's session dir: Ray's fake node provider
    ends a removed node's raylet, but once left that node's log monitor running after the
    test, polling a GCS that was gone."""
    import contextlib

    import psutil

    for proc in naming(session):
        with contextlib.suppress(psutil.Error):
            proc.kill()


def scenario(cluster: Any, cfg: Any, scaling: dict[str, Any]) -> dict[str, Any]:
    import ray
    from ray import serve

    from deployments.app import build_app

    ray.init(address=cluster.address, log_to_driver=False)
    head = set(alive_nodes())
    event("cluster up", nodes=len(head))
    serve.start(proxy_location="Disabled")
    handle = serve.run(build_app(cfg), name=APP, route_prefix="/k8s")
    first = handle.status.remote().result(timeout_s=30)["sleep"]["replica_info"]
    event("deployed", replicas=len(first))

    async def second_replica_serving() -> bool:
        info = (await handle.status.remote())["sleep"]["replica_info"]
        return sum(r["state"] == "ALIVE" for r in info) == 2

    async def scale_up() -> tuple[int, list[dict[str, Any]]]:
        answered = await load_until(handle, second_replica_serving, 150)
        # Read the status while the load lasts: idle, the pool removes a replica in 1 s.
        return answered, await under_load(
            handle, lambda: status_json(cluster.address)["replica_info"])

    answered, replicas = asyncio.run(scale_up())
    added = sorted(set(alive_nodes()) - head)
    event("scaled up", answered=answered, added_nodes=len(added))
    new_node = alive_nodes()[added[0]] if added else {}

    def node_removed() -> bool:
        return bool(added) and added[0] not in alive_nodes()

    wait_for(lambda: len(handle.status.remote().result(timeout_s=30)["sleep"]["replica_info"])
             == 1, 60, "the pool to scale back to one replica")
    event("pool scaled down")
    wait_for(node_removed, 90, "the autoscaler to remove the idle node")
    event("node removed")
    after = handle.infer.remote("sleep", {"INPUT0": np.array([4.0], np.float32)})
    return {"head_nodes": sorted(head), "added_nodes": added, "replicas": replicas,
            "new_node_resources": new_node.get("Resources", {}),
            "new_node_labels": new_node.get("Labels", {}),
            "worker_type": scaling["available_node_types"][GROUP],
            "answered": answered, "after": after.result(timeout_s=30)["OUTPUT0"].tolist(),
            "alive_after": sorted(alive_nodes())}


if __name__ == "__main__":
    print("RESULT " + json.dumps(run(Path(sys.argv[1]))), flush=True)
