"""A Ray node's numa<N> resources and labels, `ray start` argv, and each replica's NUMA node."""

from __future__ import annotations

import json
import os
import re
from typing import ClassVar

import pytest

from cluster.config import ReplicaConfig
from cluster.pinning import NUMA_NODE_ENV, SYSFS_ROOT_ENV
from cluster.raynode import (
    NodeNuma,
    NumaChooser,
    autoscale_labels,
    merge_node_options,
    node_labels,
    node_resources,
    numa_amounts,
    numa_nodes,
    numa_request,
    ray_start_argv,
)
from cluster.topology import discover
from raybatch.main import main
from raybatch.serving import local_node_options

# Ray 2.60's node label syntax (ray._private.label_utils), without importing Ray here.
LABEL_NAME = re.compile(r"[a-zA-Z0-9]([a-zA-Z0-9_.-]{0,61}[a-zA-Z0-9])?")


def test_resources_count_usable_physical_cores_per_node(two_socket, container, no_numa):
    assert node_resources(discover(two_socket.root)) == {"numa0": 8.0, "numa1": 8.0}
    assert node_resources(discover(container.root)) == {"numa0": 2.0, "numa1": 2.0}
    assert node_resources(discover(no_numa.root)) == {"numa0": 3.0}  # cpu3 is offline


def test_labels_say_what_the_node_has_in_rays_syntax(four_gpu, hybrid):
    labels = node_labels(discover(four_gpu.root))
    assert labels == {"raybatch.io/numa-nodes": "2", "raybatch.io/primary-numa": "0",
                      "raybatch.io/cores": "16", "raybatch.io/gpus": "4"}
    for key, value in (*labels.items(), *node_labels(discover(hybrid.root)).items()):
        _, name = key.split("/")
        assert LABEL_NAME.fullmatch(name) and LABEL_NAME.fullmatch(value), (key, value)


def test_ray_start_argv_joins_or_starts_a_head(two_socket):
    topo = discover(two_socket.root)
    argv = ray_start_argv(topo, address="10.0.0.1:6379", num_cpus=4, extra=["--foo"])
    assert argv[:6] == ["ray", "start", "--address", "10.0.0.1:6379", "--num-cpus", "4"]
    assert json.loads(argv[argv.index("--resources") + 1]) == {"numa0": 8, "numa1": 8}
    labels = dict(kv.split("=") for kv in argv[argv.index("--labels") + 1].split(","))
    assert labels == node_labels(topo)
    assert argv[-2:] == ["--block", "--foo"]
    head = ray_start_argv(topo, head=True, block=False)
    assert head[:3] == ["ray", "start", "--head"] and "--block" not in head
    for kwargs in ({}, {"address": "x:1", "head": True}):
        with pytest.raises(ValueError, match="exactly one of --address HOST:PORT"):
            ray_start_argv(topo, **kwargs)


def test_join_dry_run_prints_the_ray_start_command(two_socket, capsys):
    assert main(["join", "--address", "10.0.0.1:6379", "--sysfs-root", str(two_socket.root),
                 "--dry-run", "--", "--object-store-memory", "100000000"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("$ ") and " start --address 10.0.0.1:6379 --resources " in out
    assert """'{"numa0": 8, "numa1": 8}'""" in out
    command, env = out.rstrip().splitlines()
    assert command.endswith("--block --object-store-memory 100000000")
    # Serve's switches go into the node's environment (the controller reads them there)
    assert env.startswith("with RAY_SERVE_THROUGHPUT_OPTIMIZED=1 RAY_SERVE_ENABLE_DIRECT_INGRESS=1")
    assert main(["join", "--dry-run", "--sysfs-root", str(two_socket.root)]) == 2
    assert "exactly one of --address" in capsys.readouterr().err


def flag(argv: list[str], name: str) -> str:
    return argv[argv.index(name) + 1]


def test_a_users_resources_and_labels_merge_with_the_nodes(two_socket):
    topo = discover(two_socket.root)
    argv = ray_start_argv(topo, address="h:1", extra=[
        "--resources", '{"accel": 2, "numa1": 4}', "--object-store-memory", "1",
        "--labels=zone=a, raybatch.io/gpus=1"])
    assert json.loads(flag(argv, "--resources")) == {"numa0": 8, "numa1": 4, "accel": 2}
    labels = dict(kv.split("=") for kv in flag(argv, "--labels").split(","))
    assert labels == {**node_labels(topo), "zone": "a", "raybatch.io/gpus": "1"}
    assert argv.count("--resources") == argv.count("--labels") == 1
    assert argv[-3:] == ["--block", "--object-store-memory", "1"]
    notes = merge_node_options(topo, ["--resources={\"numa1\": 4, \"numa0\": 8}"]).notes
    assert notes == ["note: the resource numa1=4 you passed replaces Raybatch's numa1=8"]


@pytest.mark.parametrize(("extra", "message"), [
    (["--resources", "{accel: 1}"], r"--resources '\{accel: 1\}' is not valid JSON \("
                                    r"Expecting property name .* e\.g\. --resources"),
    (["--resources", "[1]"], "is not a JSON object"),
    (["--resources", '{"x": "many"}'], "x='many' must be a finite number >= 0"),
    (["--resources", '{"x": -1}'], "x=-1 must be a finite number >= 0"),
    (["--resources", '{"x": 1e400}'], "x=inf must be a finite number >= 0"),  # json's inf
    (["--resources", '{"x": NaN}'], "x=nan must be a finite number >= 0"),
    (["--resources"], "--resources needs a value"),
    (["--labels", "zone"], "'zone' is not key=value"),
])
def test_invalid_resources_or_labels_are_refused_with_the_fix(two_socket, extra, message):
    with pytest.raises(ValueError, match=message):
        ray_start_argv(discover(two_socket.root), head=True, extra=extra)


def test_join_says_what_it_merged_and_refuses_what_it_cannot(two_socket, capsys):
    root = str(two_socket.root)
    assert main(["join", "--address", "10.0.0.1:6379", "--sysfs-root", root, "--dry-run",
                 "--", "--resources", '{"numa0": 2, "gpu_slot": 1}']) == 0
    out = capsys.readouterr().out
    assert """'{"gpu_slot": 1, "numa0": 2, "numa1": 8}'""" in out
    assert "note: the resource numa0=2 you passed replaces Raybatch's numa0=8" in out
    assert main(["join", "--head", "--sysfs-root", root, "--dry-run",
                 "--", "--resources", "{'x': 1}"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("raybatch join: --resources \"{'x': 1}\" is not valid JSON"), err


@pytest.fixture
def home(tmp_path, monkeypatch):
    """A home of the test's own and no RAY_AUTH_* of the caller's."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    for key in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH"):
        monkeypatch.delenv(key, raising=False)
    return tmp_path / "home"


class FakeRayStart:
    """subprocess.Popen for `ray start`: records the environment, ends at once."""

    calls: ClassVar[list[dict]] = []

    def __init__(self, argv, env, **how):
        FakeRayStart.calls.append({"argv": argv, "env": env})
        r, w = os.pipe()  # its output, as `raybatch join` reads it
        os.write(w, b"Ray runtime started.\n")
        os.close(w)
        self.stdout = os.fdopen(r, "rb")

    def poll(self):
        return 0

    def wait(self):
        return 0


def test_join_head_turns_token_auth_on_and_makes_a_token_where_none_is(
        two_socket, home, monkeypatch, capsys):
    monkeypatch.setattr("subprocess.Popen", FakeRayStart)
    FakeRayStart.calls = []
    assert main(["join", "--head", "--sysfs-root", str(two_socket.root)]) == 0
    token = (home / ".ray" / "auth_token").read_text()
    env = FakeRayStart.calls[0]["env"]
    assert env["RAY_AUTH_MODE"] == "token" and "RAY_AUTH_TOKEN" not in env
    out = capsys.readouterr().out
    assert f"token authentication: on, the token in {home}/.ray/auth_token" in out
    assert token not in out


def test_join_brings_the_token_a_head_asks_for(two_socket, home, tmp_path, monkeypatch,
                                               capsys):
    from cluster import rayauth

    token = tmp_path / "cluster-token"
    token.write_text("the-clusters-token")
    asked = []

    def head(address, sent, timeout_s):
        asked.append((address, sent))
        return rayauth.Reply.ACCEPTED if sent == "the-clusters-token" else \
            rayauth.Reply.REFUSED

    monkeypatch.setattr(rayauth, "probe_gcs", head)
    monkeypatch.setattr(rayauth, "resolve_address", lambda address: address)
    monkeypatch.setattr("subprocess.Popen", FakeRayStart)
    FakeRayStart.calls = []
    argv = ["join", "--address", "10.0.0.1:6379", "--sysfs-root", str(two_socket.root)]
    assert main(argv) == 2  # no token here
    err = capsys.readouterr().err
    assert "raybatch join: the Ray cluster at 10.0.0.1:6379 asks for an authentication " \
           "token and there is none here" in err
    assert main([*argv, "--auth-token-file", str(token)]) == 0
    env = FakeRayStart.calls[0]["env"]
    assert (env["RAY_AUTH_MODE"], env["RAY_AUTH_TOKEN_PATH"]) == ("token", str(token))
    assert asked[-2:] == [("10.0.0.1:6379", None), ("10.0.0.1:6379", "the-clusters-token")]
    out = capsys.readouterr().out
    assert "the-clusters-token" not in out + " ".join(FakeRayStart.calls[0]["argv"])


def test_up_gives_the_local_node_its_numa_resources(container, monkeypatch, capsys):
    monkeypatch.delenv(SYSFS_ROOT_ENV, raising=False)
    options = local_node_options(str(container.root))
    assert options["resources"] == {"numa0": 2.0, "numa1": 2.0}
    assert options["labels"]["raybatch.io/cores"] == "4"
    assert os.environ[SYSFS_ROOT_ENV] == str(container.root)  # replicas pin by the same tree
    assert local_node_options(str(container.root / "missing")) == {}
    assert "replicas run unpinned" in capsys.readouterr().out


def test_numa_amounts_picks_the_numa_resources():
    assert numa_amounts({"CPU": 4, "numa0": 2, "numa12": 1.0, "numa": 3, "xnuma1": 1}) == {
        0: 2.0, 12: 1.0}


def nodes(*specs: tuple[dict[int, float], dict[int, float], int | None]) -> list[NodeNuma]:
    return [NodeNuma(available, total, primary) for available, total, primary in specs]


def test_the_most_free_node_wins_ties_go_to_the_primary_then_the_lowest():
    chooser = NumaChooser()
    assert chooser.choose(nodes(({0: 2, 1: 5}, {0: 8, 1: 8}, 0)), 1, now=0) == 1
    assert NumaChooser().choose(nodes(({0: 4, 1: 4}, {0: 8, 1: 8}, 1)), 1, now=0) == 1
    assert NumaChooser().choose(nodes(({0: 4, 1: 4}, {0: 8, 1: 8}, None)), 1, now=0) == 0
    assert NumaChooser().choose([], 1, now=0) is None  # no numa resources: ask for none


def test_free_slots_count_node_by_node():
    # numa0 has 3 free cores in all but 1 + 2 on two nodes: one replica of 2 fits there;
    # numa1's 2 free cores on one node also hold one; tie -> lowest.
    view = nodes(({0: 1, 1: 2}, {0: 4, 1: 4}, None), ({0: 2}, {0: 4}, None))
    assert NumaChooser().choose(view, 2, now=0) == 0
    view = nodes(({0: 1, 1: 2}, {0: 4, 1: 4}, None), ({0: 1}, {0: 4}, None))
    assert NumaChooser().choose(view, 2, now=0) == 1  # 1 + 1 free on numa0 hold no replica


def test_replicas_created_back_to_back_spread_before_ray_counts_them():
    chooser = NumaChooser()
    view = nodes(({0: 1}, {0: 1}, 0), ({1: 1}, {1: 1}, 1))  # node A numa0, node B numa1
    assert [chooser.choose(view, 1, now=0.0) for _ in range(2)] == [0, 1]
    # Ray now counts both, so the claims go; a third pends where it could ever fit.
    placed = nodes(({0: 0}, {0: 1}, 0), ({1: 0}, {1: 1}, 1))
    assert chooser.choose(placed, 1, now=1.0) == 0
    assert chooser._pending == {0: 1, 1: 0}


def test_a_claim_ray_never_counts_expires():
    chooser = NumaChooser(claim_ttl_s=30.0)
    view = nodes(({0: 2, 1: 1}, {0: 2, 1: 1}, 0))
    assert chooser.choose(view, 1, now=0.0) == 0  # Ray never places it (say it failed)
    assert chooser.choose(view, 1, now=1.0) == 0  # 2 - 1 claimed = 1 vs 1: tie, primary
    assert chooser.choose(view, 1, now=2.0) == 1  # 2 - 2 claimed < 1
    assert chooser.choose(view, 1, now=40.0) == 0  # claims expired: numa0 has 2 free again


def test_what_a_replica_asks_for():
    chooser = NumaChooser()
    view = nodes(({0: 1, 1: 3}, {0: 4, 1: 4}, 0))
    asked = []

    def look():
        asked.append(1)
        return view

    assert numa_request(ReplicaConfig(num_cpus=2.7), chooser, look, 0) == (
        {"numa1": 2.0}, {NUMA_NODE_ENV: "1"})
    for replicas in (ReplicaConfig(num_cpus=0.5), ReplicaConfig(num_cpus=2, pin="off")):
        assert numa_request(replicas, chooser, look, 0) == ({}, {})
    gpu = numa_request(ReplicaConfig(num_cpus=2, num_gpus=1), chooser, look, 0)
    assert gpu == ({}, {"CUDA_DEVICE_ORDER": "PCI_BUS_ID"})
    own = numa_request(ReplicaConfig(num_cpus=1, resources={"numa3": 1}), chooser, look, 0)
    assert own == ({}, {NUMA_NODE_ENV: "3"})  # the config's own resource stands
    assert len(asked) == 1  # Ray is asked only for a replica that needs a NUMA node
    assert numa_request(ReplicaConfig(num_cpus=1), NumaChooser(), lambda: [], 0) == ({}, {})


def ray_node(node_id: str, resources: dict, labels: dict | None = None, alive: bool = True):
    """One entry of `ray.nodes()`, as much of it as `numa_nodes` reads."""
    return {"NodeID": node_id, "Alive": alive, "Resources": resources, "Labels": labels or {}}


def test_the_view_has_live_numa_nodes_and_the_nodes_an_autoscaler_can_add():
    head = ray_node("h", {"CPU": 0}, autoscale_labels({"numa0": 4}))  # a Kubernetes head
    worker = ray_node("w", {"CPU": 4, "numa0": 4}, {"raybatch.io/primary-numa": "0"})
    gone = ray_node("g", {"numa1": 4}, alive=False)
    assert autoscale_labels({"numa0": 4.0, "numa1": 2}) == {
        "raybatch.io/autoscale-numa0": "4", "raybatch.io/autoscale-numa1": "2"}
    view = numa_nodes([head, worker, gone], {"w": {"numa0": 1.0}})
    assert view == [NodeNuma({}, {0: 4.0}), NodeNuma({0: 1.0}, {0: 4.0}, 0)]
    assert numa_nodes([ray_node("x", {"CPU": 8})], None) == []  # plain `ray start`: none


def test_before_any_worker_is_up_a_replica_still_asks_for_the_autoscalers_numa_node():
    # A fresh RayService: only the head (num-cpus 0) is up; its labels say worker pods
    # advertise numa0: 4. The replica asks numa0 (it pends; a pod comes; it pins there).
    head = ray_node("h", {"CPU": 0}, autoscale_labels({"numa0": 4}))
    view = lambda: numa_nodes([head], {"h": {}})  # noqa: E731
    assert numa_request(ReplicaConfig(num_cpus=2), NumaChooser(), view, 0) == (
        {"numa0": 2.0}, {NUMA_NODE_ENV: "0"})
    too_big = numa_request(ReplicaConfig(num_cpus=8), NumaChooser(), view, 0)
    assert too_big == ({"numa0": 8.0}, {NUMA_NODE_ENV: "0"})  # fits nowhere: pool warns
