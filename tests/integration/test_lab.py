"""The lab of hosts (`benchmarks.cluster.lab`): each host is a machine of its own on the lab's
network only, with its CPU quota and its /tmp; faults cut it off without a word; nothing is
left behind, not even by a test killed with SIGKILL; and a Ray head with two hosts joined
is one cluster of three nodes at the hosts' addresses.

Needs root, iproute2 and a cgroup cpu controller: skipped, saying why, elsewhere. One lab
per machine at a time (a lock), so each test makes its own or shares the class's.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from benchmarks.cluster.lab import HEAD_IP, HEAD_RAY_TMP, Lab, leftovers
from tests.conftest import HANG_S, ROOT, alive

# the lab's Ray head may take three tries to start on a busy machine, up to 120 s each
# (`Lab.start_head`): the suite's 300 s guard against a hang would end the test first
pytestmark = [pytest.mark.integration, pytest.mark.own_ray, pytest.mark.timeout(600)]

ECHO_PORT = 7000  # in a host's own network namespace: free whatever the machine runs
# Greets each connection with "<its local address> <its peer's address>", then echoes.
ECHO = r"""
import socket, sys, threading
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1])))
s.listen(16)
print("READY", flush=True)
def serve(c):
    with c:
        c.sendall(f"{c.getsockname()[0]} {c.getpeername()[0]}\n".encode())
        while data := c.recv(65536):
            c.sendall(data)
while True:
    threading.Thread(target=serve, args=(s.accept()[0],), daemon=True).start()
"""
# Tries a TCP connection to each address at a port; prints {address: "ok" or the error}.
CONNECT = r"""
import json, socket, sys
out = {}
for a in sys.argv[2:]:
    try:
        socket.create_connection((a, int(sys.argv[1])), timeout=3).close()
        out[a] = "ok"
    except OSError as e:
        out[a] = f"{type(e).__name__} {e.errno}"
print(json.dumps(out), flush=True)
"""


@pytest.fixture(autouse=True)
def _needs_a_lab() -> None:
    why = Lab.available()
    if why:
        pytest.skip(why)


def py(script: str, *args: object) -> list[str]:
    return [sys.executable, "-S", "-c", script, *map(str, args)]


def start_echo(lab: Lab, host: int) -> None:
    """The echo server on `host`, unless it runs there already."""
    try:
        socket.create_connection((lab.address(host), ECHO_PORT), timeout=1).close()
    except OSError:
        proc = lab.run(host, py(ECHO, ECHO_PORT), stdout=subprocess.PIPE, text=True)
        assert proc.stdout.readline().strip() == "READY"


def connect(address: str, timeout_s: float = 5.0) -> tuple[socket.socket, str]:
    """A connection to the echo server at `address`, and its greeting."""
    conn = socket.create_connection((address, ECHO_PORT), timeout=timeout_s)
    greeting = b""
    while not greeting.endswith(b"\n"):
        greeting += conn.recv(100)
    return conn, greeting.decode().strip()


class TestTwoHosts:
    @pytest.fixture(scope="class")
    @classmethod
    def lab(cls):
        with Lab(hosts=2, cpus=0.4) as lab:
            yield lab

    def test_each_host_answers_the_head_at_its_own_address(self, lab):
        for host in (0, 1):
            start_echo(lab, host)
            conn, greeting = connect(lab.address(host))
            with conn:
                assert greeting == f"{lab.address(host)} {HEAD_IP}"
                conn.sendall(b"hello")
                assert conn.recv(5) == b"hello"

    def test_a_host_reaches_the_lab_only(self, lab):
        outside = [a.split()[3].split("/")[0] for a in subprocess.run(
            ["ip", "-o", "-4", "addr", "show"], capture_output=True, text=True,
            check=True).stdout.splitlines()]
        outside = [a for a in outside if not a.startswith(("127.", "198.18.0."))]
        with socket.socket() as listener:  # the machine's: on every address of the root
            listener.bind(("0.0.0.0", 0))
            listener.listen(8)
            port = listener.getsockname()[1]
            probe = lab.run(0, py(CONNECT, port, HEAD_IP, *outside),
                            stdout=subprocess.PIPE, text=True)
            reached = json.loads(probe.communicate(timeout=HANG_S)[0])
        assert reached.pop(HEAD_IP) == "ok"
        assert outside == [] or set(reached) == set(outside)
        assert all(r != "ok" for r in reached.values()), reached  # 101: ENETUNREACH
        start_echo(lab, 1)
        probe = lab.run(0, py(CONNECT, ECHO_PORT, lab.address(1)), stdout=subprocess.PIPE,
                        text=True)
        assert json.loads(probe.communicate(timeout=HANG_S)[0]) == {lab.address(1): "ok"}

    def test_a_host_gets_its_cpu_quota_and_no_more(self, lab):
        def used_s() -> float:
            return lab.cpu_stat(0)["usage_usec"] / 1e6

        for _ in range(2):  # two busy processes: the quota is the host's, not each one's
            lab.run(0, py("while True: pass"))
        start = used_s()
        while used_s() < start + 0.05:  # both running
            time.sleep(0.01)
        used0, throttled0, t0 = used_s(), lab.cpu_stat(0)["nr_throttled"], time.monotonic()
        time.sleep(1.0)
        used, wall = used_s() - used0, time.monotonic() - t0
        throttled = lab.cpu_stat(0)["nr_throttled"] - throttled0
        lab.kill(0)
        # CFS hands out 0.04 s per 0.1 s period: one period of slack, and the reads' own
        assert 0.0 < used <= 0.4 * wall + 0.05, (used, wall)
        assert throttled >= 1  # it was the quota that held them back, not a busy machine

    def test_the_head_weighs_as_a_few_tasks_while_its_ray_starts_and_as_one_after(self, lab):
        """While the head's Ray starts (`head_starting`) its cgroup weighs as 8 busy tasks of
        the machine: beside 8 busy processes, each in a session of its own (the kernel's
        autogroups weigh each as one group), a busy process of the head gets far more CPU
        than one of them. With the weight of one, beside 24 such processes the head's GCS
        answered its raylet too late and `ray start` gave up three times in a row. After, it
        weighs as one session, no more than any of them: kept at 8 while it served, the head
        took most of a core from the other test lane. Each comparison is over the same
        second, so a slow machine shifts both sides."""
        def cpu_ticks(pid: int) -> int:
            fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
            return int(fields[11]) + int(fields[12])  # utime + stime

        def over_a_second(head: subprocess.Popen) -> tuple[int, list[int]]:
            before = cpu_ticks(head.pid), [cpu_ticks(p.pid) for p in crowd]
            time.sleep(1.0)
            return (cpu_ticks(head.pid) - before[0],
                    [cpu_ticks(p.pid) - b for p, b in zip(crowd, before[1])])

        crowd = [subprocess.Popen(py("while True: pass"), start_new_session=True)
                 for _ in range(8)]
        try:
            head = lab.run(None, py("while True: pass"))
            time.sleep(0.5)  # all running
            with lab.head_starting():
                starting, crowd_starting = over_a_second(head)
            serving, crowd_serving = over_a_second(head)
        finally:
            lab.kill(None)
            for p in crowd:
                p.kill()
                p.wait()
        assert starting > 2 * max(crowd_starting), (starting, crowd_starting)
        assert serving < 2 * max(crowd_serving), (serving, crowd_serving)

    def test_each_host_has_its_own_tmp(self, lab):
        name = f"lab-private-{os.getpid()}"
        assert lab.run(0, ["sh", "-c", f"echo here > /tmp/{name}"]).wait(timeout=HANG_S) == 0
        assert lab.run(0, ["test", "-e", f"/tmp/{name}"]).wait(timeout=HANG_S) == 0
        assert lab.run(1, ["test", "-e", f"/tmp/{name}"]).wait(timeout=HANG_S) == 1
        assert not (Path("/tmp") / name).exists()
        assert (lab.tmp_dir(0) / name).read_text() == "here\n"

    def test_a_partition_cuts_a_host_off_without_a_word_and_heal_restores_it(self, lab):
        start_echo(lab, 1)
        conn, _ = connect(lab.address(1))
        with conn:
            conn.sendall(b"a")
            assert conn.recv(1) == b"a"
            lab.partition(1)
            try:
                conn.sendall(b"b")
                conn.settimeout(1.0)
                with pytest.raises(TimeoutError):  # no data, and no FIN (b"") nor RST
                    conn.recv(1)
                with pytest.raises(OSError):
                    connect(lab.address(1), timeout_s=1.0)
            finally:
                lab.heal(1)
            conn.settimeout(20.0)  # TCP retransmits "b": the same connection goes on
            assert conn.recv(1) == b"b"
        connect(lab.address(1))[0].close()

    def test_kill_ends_every_process_of_that_host_only(self, lab):
        procs = [lab.run(0, ["sh", "-c", "sleep 300 & sleep 300 & wait"]),
                 lab.run(0, ["sleep", "300"])]
        other = lab.run(1, ["sleep", "300"])
        while len(lab.pids(0)) < 4:  # the shell and its two, and the other sleep
            time.sleep(0.01)
        lab.kill(0)
        assert lab.pids(0) == set()
        assert [p.wait(timeout=HANG_S) for p in procs] == [-signal.SIGKILL] * 2
        assert other.poll() is None and other.pid in lab.pids(1)

    def test_power_loss_kills_the_host_and_nothing_reaches_the_head(self, lab):
        start_echo(lab, 0)
        conn, _ = connect(lab.address(0))
        with conn:
            lab.power_loss(0)
            assert lab.pids(0) == set()
            conn.settimeout(1.0)
            with pytest.raises(TimeoutError):  # the dying server's FIN was lost
                conn.recv(1)
        lab.heal(0)


def test_a_bandwidth_limit_holds_and_close_leaves_nothing():
    with Lab(hosts=1, bandwidth_mbit=8) as lab:  # 1 MB/s each way
        sleeper = lab.run(0, ["sleep", "300"])
        start_echo(lab, 0)
        conn, _ = connect(lab.address(0))
        with conn:
            data, back = os.urandom(1_000_000), bytearray()
            start = time.monotonic()
            conn.sendall(data)
            conn.settimeout(30.0)
            while len(back) < len(data):
                back += conn.recv(1 << 20)
            took_s = time.monotonic() - start
        assert bytes(back) == data
        assert took_s >= 0.8, took_s  # a 16 KiB burst, then 1 MB/s: never faster
    assert sleeper.wait(timeout=HANG_S) == -signal.SIGKILL
    assert leftovers() == []
    with pytest.raises(RuntimeError, match="inside"), Lab(hosts=1) as lab:
        lab.run(0, ["sleep", "300"])
        raise RuntimeError("inside")
    assert leftovers() == []


CRASH = """
import sys, time
from benchmarks.cluster.lab import Lab
lab = Lab(hosts=2).start()
print(lab.run(0, ["sleep", "300"]).pid, flush=True)
time.sleep(300)
"""


@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM, signal.SIGINT],
                         ids=["SIGKILL", "SIGTERM", "SIGINT"])
def test_a_killed_test_leaves_nothing_after_the_next_lab(sig):
    child = subprocess.Popen([sys.executable, "-c", CRASH], cwd=ROOT, stdout=subprocess.PIPE,
                             text=True)
    sleeper = int(child.stdout.readline())
    child.send_signal(sig)
    assert child.wait(timeout=HANG_S) == -sig
    if sig != signal.SIGKILL:  # its handler closed the lab, then it died of the signal
        assert leftovers() == [] and not alive(sleeper)
        return
    left = leftovers()
    assert alive(sleeper) and "netns rblab-h1" in left and "link rblab-br" in left, left
    Lab(hosts=1).start().close()
    assert leftovers() == [] and not alive(sleeper)


@pytest.mark.slow
def test_a_ray_head_and_two_hosts_are_one_cluster_of_three_nodes(tmp_path):
    with Lab(hosts=2, cpus=0.4) as lab:
        head = lab.start_head(num_cpus=1, log=tmp_path / "head.log")
        for host in (0, 1):
            lab.join(host, head, resources={f"host{host}": 1}, log=tmp_path / f"h{host}.log")
        nodes = lab.wait_nodes(head, 3, timeout_s=90)
        ips = {n["NodeManagerAddress"]: n for n in nodes if n["Alive"]}
        assert sorted(ips) == sorted([HEAD_IP, lab.address(0), lab.address(1)])
        for host in (0, 1):
            node = ips[lab.address(host)]
            assert node["Resources"][f"host{host}"] == 1 and node["Resources"]["CPU"] == 1
            # each host's Ray session is in its own /tmp, not in the machine's
            socket_path = Path(node["ObjectStoreSocketName"])
            assert socket_path.is_relative_to("/tmp/ray") and not socket_path.exists()
            assert (lab.tmp_dir(host) / socket_path.relative_to("/tmp")).exists()
        assert Path(ips[HEAD_IP]["ObjectStoreSocketName"]).is_relative_to(HEAD_RAY_TMP)
    assert leftovers() == []
