"""The documented cluster path on a Ray cluster with token authentication on, as Ray 2.60
turns it on for a head on any machine where a local Ray ran before: `raybatch up
--address` and `raybatch status` work with no variable set, a node joins with a copy of
the token (`--auth-token-file`), and a client without the token (or with another one) is
told what to do. The head is forced into token mode (RAY_AUTH_MODE=token in its own
environment only) and its token is the machine's ~/.ray/auth_token, as after a local
`raybatch up`: a bare Ray client in the same environment as the commands is refused,
which is the failure the commands are checked against.

The cluster is this test's own: a `raybatch join --head` on free ports with a Ray temp
dir of its own and a HOME of its own (so the machine's token is never read or written);
it is stopped by signalling the processes it started, and whatever of it is left
(found by its GCS port) is killed: never another Ray on the machine.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from cluster.ports import free_port
from cluster.rayauth import Reply, generate_token, probe_gcs
from tests.conftest import HANG_S, ROOT

pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.own_ray]

AUTH_VARS = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_AUTH_TOKEN_PATH", "RAY_ADDRESS")
CONFIG = """\
app_name: raybatch-auth
ingress: {num_cpus: 0.1, route_prefix: /auth, grpc_port: null, haproxy: false}
models:
  - name: square
    transformer: deployments.models:Square
    inputs:  [{name: INPUT0, datatype: FP32, shape: [-1]}]
    outputs: [{name: OUTPUT0, datatype: FP32, shape: [-1]}]
    replicas: {min_replicas: 1, max_replicas: 1, num_cpus: 0.1}
"""


def raybatch(*args: str, env: dict[str, str], timeout_s: float = HANG_S):
    return subprocess.run([sys.executable, "-m", "raybatch", *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=timeout_s)


class Node:
    """A `raybatch join` in a session of its own, its output in a file."""

    def __init__(self, args: list[str], env: dict[str, str], log: Path) -> None:
        self.log = log
        with open(log, "w") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "raybatch", "join", *args], cwd=ROOT, env=env,
                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)

    def text(self) -> str:
        return self.log.read_text()

    def stop(self) -> None:
        """SIGTERM, as a service manager stops it: `raybatch join` passes it on to
        `ray start --block`, which stops the node's processes."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(timeout=HANG_S / 2)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def kill_cluster_leftovers(gcs_port: int) -> list[str]:
    """Kill this user's processes of the cluster whose GCS listens on `gcs_port` (each
    names it in its command line: the GCS's own port, or the GCS address every other
    process is given); returns what was left."""
    import psutil

    marks = (f"--gcs_server_port={gcs_port}\0", f":{gcs_port}\0", f"--port\0{gcs_port}\0")
    left = []
    for p in psutil.process_iter(["cmdline", "uids"]):
        try:
            line = "\0".join(p.info["cmdline"] or []) + "\0"
            if p.info["uids"].real == os.getuid() and p.pid != os.getpid() and \
                    any(mark in line for mark in marks):
                left.append(f"{p.pid} {line.replace(chr(0), ' ')[:160]}")
                p.kill()
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            continue
    return left


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A token-auth head (RAY_AUTH_MODE=token in its environment only), the clients'
    environment (no auth variable at all), and where the token is."""
    work = tmp_path_factory.mktemp("cluster-auth")
    home = work / "home"
    generate_token(home / ".ray" / "auth_token")  # what a local `raybatch up` leaves
    (work / "app.yaml").write_text(CONFIG)
    temp_dir = tempfile.mkdtemp(prefix="rb-auth-", dir="/tmp")  # short: Ray's sockets
    port = free_port()
    clients = {k: v for k, v in os.environ.items() if k not in AUTH_VARS}
    clients.update({"HOME": str(home), "PYTHONPATH": str(ROOT),
                    "RAYBATCH_STATE_DIR": str(work / "state"),
                    # no load balancer to wait for: the nodes stop without Serve's 30 s
                    "RAY_SERVE_DIRECT_INGRESS_MIN_DRAINING_PERIOD_S": "0",
                    "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "1"})
    head_env = {**clients, "RAY_AUTH_MODE": "token"}
    head = Node(["--head", "--num-cpus", "2", "--config", str(work / "app.yaml"),
                 "--", "--port", str(port), "--temp-dir", temp_dir,
                 "--include-dashboard=false", "--disable-usage-stats",
                 "--ray-client-server-port", str(free_port()),
                 "--dashboard-agent-listen-port", str(free_port()),
                 "--resources", '{"accel": 1}'], head_env, work / "head.log")
    address = f"127.0.0.1:{port}"
    token = (home / ".ray" / "auth_token").read_text()
    nodes = [head]
    try:
        deadline = time.monotonic() + HANG_S
        while probe_gcs(address, token, 2.0) is not Reply.ACCEPTED:
            assert head.proc.poll() is None, f"the head did not start:\n{head.text()[-4000:]}"
            assert time.monotonic() < deadline, f"no head at {address}:\n{head.text()[-4000:]}"
        yield {"address": address, "env": clients, "work": work, "token": token,
               "nodes": nodes, "head": head}
    finally:
        for node in reversed(nodes):
            node.stop()
        left = kill_cluster_leftovers(port)
        subprocess.run(["rm", "-rf", temp_dir], check=False)
        assert not left, f"left running after the nodes stopped: {left}"


def test_the_head_refuses_a_client_without_its_token(cluster):
    """The failure the commands are checked against: Ray's own client, with the machine's
    token in ~/.ray/auth_token and no variable set, is refused by the head."""
    assert probe_gcs(cluster["address"], None, 10.0) is Reply.REFUSED
    # One connection attempt, not Ray's 20 a second apart: the head is up (the fixture
    # was answered with the token), so each attempt is refused alike; only the count of
    # retries differs from the commands' environment, not what is sent.
    bare = subprocess.run(
        [sys.executable, "-c", f"import ray; ray.init(address={cluster['address']!r})"],
        env={**cluster["env"], "RAY_NUM_REDIS_GET_RETRIES": "1"}, capture_output=True,
        text=True, timeout=HANG_S)
    assert bare.returncode != 0
    assert "Authentication token is missing or incorrect" in bare.stdout + bare.stderr, \
        (bare.stdout[-2000:], bare.stderr[-3000:])


def test_up_and_status_on_the_token_cluster_need_no_variable(cluster):
    env, address = cluster["env"], cluster["address"]
    up = raybatch("up", "--address", address, "--config", str(cluster["work"] / "app.yaml"),
                  "--port", str(free_port()), "--exit-after-deploy", env=env)
    out = up.stdout + up.stderr
    assert up.returncode == 0, out[-4000:]
    assert "token authentication: on at " in out, out[-3000:]  # at the GCS's own address
    assert "Raybatch is serving at" in out and cluster["token"] not in out
    status = raybatch("status", "--address", address, "--app", "raybatch-auth", "--json",
                      env=env)
    assert status.returncode == 0, (status.stdout[-2000:], status.stderr[-3000:])
    stats = json.loads(status.stdout)
    assert stats["square"]["replicas"] == 1, stats
    assert cluster["token"] not in status.stdout + status.stderr


def test_a_node_joins_with_a_copy_of_the_token_and_keeps_its_merged_resources(cluster):
    work, address = cluster["work"], cluster["address"]
    copy = work / "token-copy"
    copy.write_text(cluster["token"])
    elsewhere = {**cluster["env"], "HOME": str(work / "elsewhere")}  # no ~/.ray/auth_token
    node = Node(["--address", address, "--num-cpus", "1", "--auth-token-file", str(copy),
                 "--", "--dashboard-agent-listen-port", str(free_port())], elsewhere,
                work / "worker.log")
    cluster["nodes"].append(node)
    script = ("import json, ray; from cluster import rayauth; "
              f"rayauth.connect_here({address!r}); ray.init(address={address!r}); "
              "print('NODES ' + json.dumps([n['Resources'] for n in ray.nodes() "
              "if n['Alive']]))")
    deadline = time.monotonic() + HANG_S
    while True:
        assert node.proc.poll() is None, f"the node did not join:\n{node.text()[-4000:]}"
        probe = subprocess.run([sys.executable, "-c", script], cwd=ROOT, env=cluster["env"],
                               capture_output=True, text=True, timeout=HANG_S)
        assert probe.returncode == 0, probe.stderr[-3000:]
        nodes = json.loads(probe.stdout.split("NODES ", 1)[1])
        if len(nodes) == 2:
            break
        assert time.monotonic() < deadline, f"one node after {HANG_S} s:\n{node.text()}"
        time.sleep(2)
    assert "token authentication: on at" in node.text() and cluster["token"] not in node.text()
    head = next(r for r in nodes if "accel" in r)  # the head's --resources, merged
    assert head["accel"] == 1 and any(k.startswith("numa") for k in head), nodes
    assert all(any(k.startswith("numa") for k in r) for r in nodes), nodes


def test_a_client_without_the_token_or_with_another_is_told_what_to_do(cluster):
    env = {**cluster["env"], "HOME": str(cluster["work"] / "no-token-home")}
    missing = raybatch("status", "--address", cluster["address"], env=env)
    assert missing.returncode == 2
    assert "asks for an authentication token and there is none here" in missing.stderr
    assert "--auth-token-file FILE" in missing.stderr
    other = cluster["work"] / "other-token"
    generate_token(other)
    wrong = raybatch("status", "--address", cluster["address"], "--auth-token-file",
                     str(other), env=env)
    assert wrong.returncode == 2 and "it is not this cluster's" in wrong.stderr, wrong.stderr
    for text in (missing.stdout + missing.stderr, wrong.stdout + wrong.stderr):
        assert cluster["token"] not in text and other.read_text() not in text
