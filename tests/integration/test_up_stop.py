"""A local `raybatch up` as a user runs it, in a process of its own: it starts without a
warning and says where it serves; Ctrl-C stops it cleanly (exit 0, having deleted the app,
once the request in flight is answered), a second Ctrl-C stops it at once (exit 130), a
request held past `ingress.stop_timeout_s` is given up on (exit 130, saying so); a killed
one leaves nothing that stops the next from serving, and `raybatch down` stops a running
one as Ctrl-C does (what it does with a dead run's leftovers: tests/unit/raybatch/test_runs.py).
Each test is one `up` (each starts a local Ray, the costliest thing here), so one `up`
shows as much as it can.

Every check is of what happened, in what order, never of how long it took: how soon each
stop ends is `python -m benchmarks.serve.reliability_times stop`'s (its targets: an idle
stop within stop_timeout_s + 5 s, a second Ctrl-C or `raybatch down` within 5 s). A wait
here fails only past HANG_S (a hang). So that a slow machine cannot make a clean stop
give up, the idle stops run with a stop_timeout_s of HANG_S; a request is known to be
held at the gate (the model's statistics say so) before Ctrl-C is sent.

Ctrl-C is sent to the process group, as a terminal does (Ray's processes get it too).
Every run records itself in a state folder of the test's own, on ports of its own.
"""

from __future__ import annotations

import json
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import CONFIGS, HANG_S, ROOT, free_port

# Each test starts `raybatch up` once or twice, each start up to three of Ray's (READY_S).
pytestmark = [pytest.mark.integration, pytest.mark.slow, pytest.mark.own_ray,
              pytest.mark.timeout(900)]

CONFIG = CONFIGS / "small.yaml"
READY = "Stop with Ctrl-C."
# How long `up` may take to say READY before it counts as hung: on a busy machine its
# local Ray can miss Ray's fixed 30 s to register (and its raylet the 15 s it gives its
# dashboard agent), and `up` starts it again, up to three times in all.
READY_S = 3 * HANG_S


class Up:
    """`raybatch up` on CONFIG in a new session, its output read line by line."""

    def __init__(self, env: dict[str, str], ports: dict[str, int], config: Path = CONFIG,
                 *args: str) -> None:
        self.ports = ports
        cmd = [sys.executable, "-m", "raybatch", "up", "--config", str(config),
               "--port", str(ports["http"]), "--grpc-port", str(ports["grpc"]),
               *(args or ("--num-cpus", "2"))]
        self.proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True,
                                     start_new_session=True)
        self.lines: queue.Queue[str] = queue.Queue()
        self.out: list[str] = []
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        for line in self.proc.stdout:
            self.lines.put(line)
        self.lines.put("")

    def wait_for(self, text: str, timeout_s: float = HANG_S) -> None:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            try:
                line = self.lines.get(timeout=1)
            except queue.Empty:
                continue
            self.out.append(line)
            if text in line:
                return
            if line == "":
                break
        raise AssertionError(f"no {text!r} from raybatch up:\n{self.text()[-4000:]}")

    def text(self) -> str:
        while not self.lines.empty():
            self.out.append(self.lines.get())
        return "".join(self.out)

    def ctrl_c(self) -> None:
        os.killpg(self.proc.pid, signal.SIGINT)

    def exit_code(self, timeout_s: float = HANG_S) -> int:
        try:
            return self.proc.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"still running after {timeout_s} s:\n{self.text()[-3000:]}") \
                from None

    def kill(self) -> None:
        try:
            os.killpg(self.proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        self.proc.wait()

    def answers(self) -> None:
        out = self.infer("/small", "square", {"name": "INPUT0", "datatype": "FP32",
                                              "shape": [1], "data": [3.0]})
        assert out["outputs"][0]["data"] == [9.0]

    def infer(self, prefix: str, model: str, tensor: dict) -> dict:
        url = f"http://127.0.0.1:{self.ports['http']}{prefix}/v2/models/{model}/infer"
        body = json.dumps({"inputs": [tensor]}).encode()
        with urllib.request.urlopen(url, body, timeout=HANG_S) as r:
            return json.load(r)

    def model_stats(self, prefix: str, model: str) -> dict:
        """The model's inference statistics (Triton's extension: `queue.count` counts the
        requests sent to the model, `success.count` those it answered)."""
        url = f"http://127.0.0.1:{self.ports['http']}{prefix}/v2/models/{model}/stats"
        with urllib.request.urlopen(url, timeout=HANG_S) as r:
            return json.load(r)["model_stats"][0]["inference_stats"]


@pytest.fixture
def world(tmp_path: Path):
    """The environment and ports of one test's runs; whatever they leave is ended."""
    from raybatch import runs

    ports = {"http": free_port(), "grpc": free_port()}
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update({runs.STATE_DIR_ENV: str(tmp_path / "state"), "PYTHONPATH": str(ROOT),
                "RAY_SERVE_HAPROXY_STATS_PORT": str(free_port()),
                "RAY_SERVE_HAPROXY_METRICS_PORT": str(free_port())})
    old = os.environ.get(runs.STATE_DIR_ENV)
    os.environ[runs.STATE_DIR_ENV] = env[runs.STATE_DIR_ENV]
    started: list[Up] = []
    yield env, ports, started
    for up in started:
        if up.proc.poll() is None:
            up.kill()
    for run in runs.runs():  # never another test's, nor a user's: this state folder only
        runs.end_run(run.run_id, grace_s=1)  # and whatever they started meanwhile
    if old is None:
        os.environ.pop(runs.STATE_DIR_ENV)
    else:
        os.environ[runs.STATE_DIR_ENV] = old


def start(world, config: Path = CONFIG, *args: str) -> Up:
    env, ports, started = world
    up = Up(env, ports, config, *args)
    started.append(up)
    return up


def left_behind() -> list[str]:
    """Processes of any recorded run whose `up` is gone."""
    from raybatch import runs

    return [runs.describe(p) for r in runs.runs() for p in runs.processes_of(r.run_id)]


def until_gone(processes: Callable[[], list], what: str = "the run's processes") -> None:
    """Wait until `processes()` is empty (a killed process takes a moment to go); fail
    with what is still there past HANG_S."""
    give_up = time.monotonic() + HANG_S
    while left := processes():
        assert time.monotonic() < give_up, f"{what} still there after {HANG_S:.0f} s: {left}"
        time.sleep(0.2)


def patient_config(tmp_path: Path, gate: Path | None = None) -> Path:
    """CONFIG with `ingress.stop_timeout_s` at HANG_S: a clean stop never gives up; with
    `gate`, a third model, `gated`, holds its batches while that file exists."""
    import yaml

    data = yaml.safe_load(CONFIG.read_text())
    data["ingress"]["stop_timeout_s"] = HANG_S
    if gate is not None:
        data["models"].append(gated_model(gate, "gated"))
    path = tmp_path / "small.yaml"
    path.write_text(json.dumps(data))
    return path


def test_up_starts_cleanly_says_where_it_serves_and_ctrl_c_lets_a_request_finish(world,
                                                                                  tmp_path):
    gate = tmp_path / "gate"
    gate.touch()
    # Another cluster named in the environment (as `ray.init` leaves it for its children)
    # is not joined without --address: the run says so, and starts its own local Ray.
    world[0]["RAY_ADDRESS"] = "127.0.0.1:1"
    up = start(world, patient_config(tmp_path, gate))
    up.wait_for(READY, READY_S)
    started = up.text()
    assert "note: RAY_ADDRESS is set (127.0.0.1:1), but without --address" in started, started
    # A clean start: no warning that is not a real problem, Ray's included.
    warnings = [line for line in started.splitlines()
                if re.search(r"\bWARN(ING)?\b|not placed", line)]
    assert not warnings, warnings
    base = f"http://127.0.0.1:{up.ports['http']}/small"  # the config's ingress.route_prefix
    assert f"Raybatch is serving at {base}\n" in started, started
    assert f"square     {base}/v2/models/square/infer" in started, started
    up.answers()
    from raybatch import runs

    [run] = runs.runs()
    assert runs.processes_of(run.run_id), "the run's processes carry its id"
    request = in_flight(up, "gated")  # at the closed gate
    t0 = time.monotonic()
    up.ctrl_c()
    up.wait_for("still stopping after")  # it says what it is waiting for
    print(up.out[-1])
    assert "finishing its requests in flight" in up.out[-1], up.out[-1]
    gate.unlink()
    assert up.exit_code() == 0, up.text()[-3000:]  # a clean stop, not a given-up one
    print(f"Ctrl-C to exit: {time.monotonic() - t0:.1f} s")
    request["thread"].join(timeout=HANG_S)
    assert request.get("out", {}).get("outputs", [{}])[0].get("data") == [4.0], request
    text = up.text()  # it waited for the request, and did not give up on it
    assert text.index("stopping: deleting the app") < text.index("still stopping after")
    assert "gave up" not in text, text[-3000:]
    # a stop as quiet as the start: no error of Ray's about the calls its ending cut short
    stopping = text[text.index("stopping: deleting the app"):]
    noise = [line for line in stopping.splitlines()
             if re.search(r"\bfailed\b|\bERROR\b|\bWARN(ING)?\b|Traceback", line)]
    assert not noise, noise
    assert not runs.processes_of(run.run_id), "nothing of the run outlives it"
    assert not runs.runs(), "a run that ended is forgotten"


def test_a_second_ctrl_c_exits_at_once_even_while_deploying(world, tmp_path):
    from raybatch import runs

    up = start(world, patient_config(tmp_path))  # the first Ctrl-C's stop never gives up
    up.wait_for("deploying")
    [run] = runs.runs()
    up.ctrl_c()
    up.wait_for("Ctrl-C again to stop at once")
    t0 = time.monotonic()
    up.ctrl_c()
    assert up.exit_code() == 130, up.text()[-3000:]
    print(f"second Ctrl-C to exit: {time.monotonic() - t0:.1f} s")
    assert "stopping at once" in up.text()
    until_gone(left_behind)
    # nor anything the run started while it was being killed (its record is gone, so
    # nothing would find such a process later)
    until_gone(lambda: [runs.describe(p) for p in runs.processes_of(run.run_id)])


HOLD_PORT = """
import socket, sys, time
s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("127.0.0.1", int(sys.argv[1]))); s.listen(); print("holding", flush=True)
time.sleep(600)
"""


def test_a_killed_up_is_cleaned_by_the_next_one_which_raybatch_down_stops(world, tmp_path):
    from raybatch import runs

    env, _, _ = world
    first = start(world)
    first.wait_for(READY, READY_S)
    [dead] = runs.runs()
    os.kill(first.proc.pid, signal.SIGKILL)  # as the OOM killer does: the up only
    first.proc.wait()
    # What outlives a killed up varies (Serve's HAProxy usually, Ray's workers until they
    # notice their raylet is gone), so the test plants one leftover that surely outlives
    # it: a process of the dead run (its environment says so, as HAProxy's does) holding
    # a port (not the run's own: what the dead run left may still hold those).
    time.sleep(2)
    holder = subprocess.Popen([sys.executable, "-c", HOLD_PORT, str(free_port())],
                              env={**env, runs.RUN_ENV: dead.run_id},
                              stdout=subprocess.PIPE, text=True)
    # reaped as soon as it is ended, so the next up does not wait on a zombie
    threading.Thread(target=holder.wait, daemon=True).start()
    try:
        assert holder.stdout.readline().strip() == "holding"
        second = start(world, patient_config(tmp_path))
        second.wait_for(READY, READY_S)
        assert "ended what a previous `raybatch up` left behind" in second.text(), \
            second.text()[-3000:]
        assert f"pid {holder.pid}" in second.text(), second.text()[-3000:]
        assert holder.wait(timeout=HANG_S) is not None
        second.answers()
    finally:
        if holder.poll() is None:
            holder.kill()
        holder.wait()

    # down's --timeout (past it, it kills the up) at HANG_S: the stop under test is the
    # clean one, whatever the machine's speed (down on a dead run's leftovers: test_runs.py)
    down = subprocess.run([sys.executable, "-m", "raybatch", "down", "--timeout",
                           str(HANG_S)], cwd=ROOT, env=env, capture_output=True, text=True,
                          timeout=2 * HANG_S)
    assert down.returncode == 0, down.stderr
    assert "killing it" not in down.stdout, down.stdout
    assert f"stopping the running `raybatch up` (pid {second.proc.pid})" in down.stdout
    assert "raybatch down: 1 run(s) ended" in down.stdout, down.stdout
    assert second.exit_code() == 0, second.text()[-3000:]
    until_gone(left_behind)
    assert not runs.runs()


def test_a_port_held_by_another_process_is_refused_with_its_pid_and_the_command(world):
    _, ports, _ = world
    with socket.socket() as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", ports["grpc"]))
        s.listen()
        up = start(world)
        assert up.exit_code() == 1
    text = up.text()
    assert f"port {ports['grpc']}: held by pid {os.getpid()}" in text, text
    assert f"`kill {os.getpid()}`" in text, text


def test_ctrl_c_while_ray_starts_stops_it_cleanly(world):
    up = start(world)
    up.wait_for("numa")  # printed just before the local Ray starts
    up.ctrl_c()
    assert up.exit_code() == 0, up.text()[-3000:]
    assert "Traceback" not in up.text() and "deploying" not in up.text(), up.text()
    until_gone(left_behind)


def gated_model(gate: Path, name: str = "square") -> dict:
    """A model that holds its batches while `gate` exists (x + 1 once it opens)."""
    return {"name": name, "transformer": "tests.models:Gated",
            "init_kwargs": {"gate_path": str(gate)},
            "inputs": [{"name": "INPUT0", "datatype": "FP32", "shape": [-1]}],
            "outputs": [{"name": "OUTPUT0", "datatype": "FP32", "shape": [-1]}],
            "replicas": {"num_cpus": 0.1}, "warmup": {"enabled": False}}


def gated_config(tmp_path: Path, gate: Path, stop_timeout_s: float) -> Path:
    path = tmp_path / "gated.yaml"
    path.write_text(json.dumps({
        "app_name": "raybatch-gated",
        "ingress": {"num_cpus": 0.1, "route_prefix": "/small",
                    "stop_timeout_s": stop_timeout_s},
        "models": [gated_model(gate)]}))
    return path


def in_flight(up: Up, model: str = "square") -> dict:
    """A request sent on a thread, returned once the model holds it at its closed gate
    (sent to the model, not answered); `result` gets its answer or its error."""
    result: dict = {}

    def send() -> None:
        try:
            result["out"] = up.infer("/small", model, {
                "name": "INPUT0", "datatype": "FP32", "shape": [1], "data": [3.0]})
        except Exception as e:  # what the client saw, asserted by the caller
            result["error"] = e

    thread = threading.Thread(target=send, daemon=True)
    thread.start()
    result["thread"] = thread
    give_up = time.monotonic() + HANG_S
    while not ((s := up.model_stats("/small", model))["queue"]["count"] == 1
               and s["success"]["count"] == 0):
        assert thread.is_alive(), result
        assert time.monotonic() < give_up, f"the request never reached the model: {s}"
        time.sleep(0.1)
    return result


def test_a_request_in_flight_past_the_bound_is_given_up_on(world, tmp_path):
    gate = tmp_path / "gate"
    gate.touch()
    up = start(world, gated_config(tmp_path, gate, stop_timeout_s=4))
    up.wait_for(READY, READY_S)
    request = in_flight(up)  # at the closed gate, which never opens
    t0 = time.monotonic()
    up.ctrl_c()
    assert up.exit_code() == 130, up.text()[-3000:]
    print(f"Ctrl-C to exit with a request held: {time.monotonic() - t0:.1f} s (bound 4 s)")
    text = up.text()  # it began a clean stop, then gave up by its bound
    assert text.index("stopping: deleting the app") < \
        text.index("gave up after 4 s (ingress.stop_timeout_s)"), text[-3000:]
    request["thread"].join(timeout=HANG_S)
    assert "error" in request and "out" not in request, request  # the request failed
    until_gone(left_behind)
