"""`raybatch up` started as its users start it, from a benchmark, and stopped with Ctrl-C.

Free ports for every port it opens (HTTP, Raybatch's own server, gRPC, HAProxy's stats
and metrics), its output in a log file, ready when it says "Stop with Ctrl-C" and a URL
answers; stopped with SIGINT, as a user stops it, and whatever of its session is left
after a grace period killed, so a failed benchmark leaves nothing behind.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

from benchmarks.peers.measure import proc_table, server_pids
from benchmarks.peers.systems import log_tail, spawn
from cluster.ports import free_port

REPO = Path(__file__).resolve().parents[2]


def start(config: Path, tmp: Path) -> tuple[subprocess.Popen, Path, dict[str, int]]:
    ports = {"port": free_port(), "native_port": free_port(), "grpc_port": free_port()}
    argv = [str(Path(sys.executable).parent / "raybatch"), "up", "--config", str(config),
            "--host", "127.0.0.1", "--port", str(ports["port"]),
            "--native-port", str(ports["native_port"]), "--grpc-port", str(ports["grpc_port"])]
    # HAProxy's stats and metrics ports are fixed (8404, 9101) unless set: free ones here.
    env = {"RAY_SERVE_HAPROXY_STATS_PORT": str(free_port()),
           "RAY_SERVE_HAPROXY_METRICS_PORT": str(free_port())}
    log = tmp / "raybatch-up.log"
    return spawn(argv, log, env=env, cwd=REPO), log, ports


def wait_started(proc: subprocess.Popen, log: Path, ready_url: str, timeout_s: float) -> None:
    """Until `raybatch up` printed "Stop with Ctrl-C" and `ready_url` answers 200."""
    give_up = time.monotonic() + timeout_s
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"raybatch up exited ({proc.returncode}) before it was ready:"
                               f"\n{log_tail(log)}")
        if "Stop with Ctrl-C" in log.read_text(errors="replace"):
            try:
                with urllib.request.urlopen(ready_url, timeout=2) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
        if time.monotonic() > give_up:
            raise RuntimeError(f"raybatch up not ready after {timeout_s:.0f} s:\n"
                               f"{log_tail(log)}")
        time.sleep(0.5)


def interrupt(proc: subprocess.Popen, grace_s: float = 90.0) -> None:
    """Ctrl-C (SIGINT) to `raybatch up`, as a user stops it; whatever of its session is
    left after `grace_s` is killed."""
    members = server_pids(proc_table(), proc.pid, sid=proc.pid)
    if proc.poll() is None:
        proc.send_signal(signal.SIGINT)
        try:
            proc.wait(grace_s)
        except subprocess.TimeoutExpired:
            print("raybatch up did not stop on Ctrl-C: killing its processes", file=sys.stderr)
    left = (server_pids(proc_table(), proc.pid, sid=proc.pid) | members) & proc_table().keys()
    for pid in left - {os.getpid()}:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    proc.wait(10)
