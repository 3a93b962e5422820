"""Ray on the lab: a head on 198.18.0.1, a node on each host, and the count of live nodes.

What it decides: every Ray process of the lab gets one environment (the same RAY_AUTH_MODE,
no usage reports, no RAY_ADDRESS of the machine's); the head runs in the root namespace
with its temp dir under /tmp/rblab-ray (not the machine's /tmp/ray, so that a sweep removes
it), each host's node in the host's own /tmp/ray; each node's object store is 128 MiB, as
three nodes share one machine's memory. Nodes are counted from a driver process of its own,
since a driver joins one cluster only and the caller may be in another.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from benchmarks.cluster.names import HEAD_IP, LAB_DIR, PREFIX, LabError

HEAD_RAY_TMP = Path(f"/tmp/{PREFIX}ray")  # the head's Ray temp dir: not the machine's /tmp/ray
OBJECT_STORE_BYTES = 128 * 1024 * 1024  # per node: three nodes share one machine's memory


class RayOnLab:
    """The Ray helpers of `Lab`, which it inherits: they start processes with its run() at
    its address() and tmp_dir() of each host."""

    def ray_env(self, env: Mapping[str, str] | None = None) -> dict[str, str]:
        """The environment of every Ray process of the lab: RAY_AUTH_MODE one value for all
        (this one's, else `disabled`), no usage reports, no RAY_ADDRESS, and 120 s, not
        Ray's 60, both for a driver to find its node in the GCS and for any process to
        give up on a GCS that does not answer: the hosts run on a fraction of a core each,
        and on a busy machine (a CPU hog and the other test lane beside) the head once took
        longer than 60 s to register a raylet, and once to answer a driver."""
        out = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        out.update(env or {})
        out.setdefault("RAY_AUTH_MODE", "disabled")
        out.setdefault("RAY_USAGE_STATS_ENABLED", "0")
        out.setdefault("RAY_gcs_server_request_timeout_seconds", "120")
        out.setdefault("RAY_gcs_rpc_server_reconnect_timeout_s", "120")
        return out

    def start_head(self, num_cpus: int = 1, ray_args: Sequence[str] = (),
                   env: Mapping[str, str] | None = None,
                   log: str | os.PathLike[str] | None = None, timeout_s: float = 60.0,
                   tries: int = 3) -> str:
        """`raybatch join --head` on 198.18.0.1 (`env` added to `ray_env()`); returns its
        GCS address once `ray start` says the head runs (its raylet registered in the GCS;
        the GCS port listening is not enough). A head whose start fails is started again,
        `tries` times in all: on a machine with a CPU hog and the other test lane beside,
        the head's raylet once died at its first call to the GCS (a RAY_CHECK on a timed
        out call) a minute after the port listened, and `ray start --block` then stopped
        the GCS too. The head weighs more while it starts (`head_starting`)."""
        log = Path(log or LAB_DIR / "head.log")
        failures = []
        for n in range(1, tries + 1):
            began = time.monotonic()
            with self.head_starting():
                address, why = self._start_head_once(num_cpus, ray_args, env, log, timeout_s)
            if address:
                return address
            failures.append(why)
            if n == tries:
                break  # the error below says it
            # said at once: were the test stopped by its own timeout during the next try,
            # this is what its output would show of the lab
            print(f"lab: the Ray head's start, try {n} of {tries}, failed after "
                  f"{time.monotonic() - began:.0f} s: {why}", file=sys.stderr, flush=True)
        raise LabError(f"the Ray head did not start in {tries} tries: " + "\n--\n".join(failures))

    def _start_head_once(self, num_cpus: int, ray_args: Sequence[str],
                         env: Mapping[str, str] | None, log: Path,
                         timeout_s: float) -> tuple[str | None, str]:
        """(its address, "") once `ray start` printed that the head runs; else (None, why),
        the attempt's processes ended."""
        from cluster.ports import free_port

        port = free_port("0.0.0.0")
        argv = [*_raybatch(), "join", "--head", "--num-cpus", str(num_cpus), "--",
                "--node-ip-address", HEAD_IP, "--port", str(port),
                "--temp-dir", str(HEAD_RAY_TMP), "--include-dashboard", "false",
                "--ray-client-server-port", str(free_port("0.0.0.0")),
                "--dashboard-agent-listen-port", str(free_port("0.0.0.0")),
                "--object-store-memory", str(OBJECT_STORE_BYTES), *ray_args]
        start = log.stat().st_size if log.exists() else 0  # the log is appended to
        proc = self.run(None, argv, env=self.ray_env(env), log=log)
        # ray start waits up to 30 s for the raylet to register, past the GCS's start
        give_up = time.monotonic() + timeout_s + 60
        while proc.poll() is None and time.monotonic() < give_up:
            with open(log, "rb") as f:
                f.seek(start)
                if b"Ray runtime started." in f.read():
                    return f"{HEAD_IP}:{port}", ""
            time.sleep(0.2)
        if proc.poll() is None:
            _kill_group(proc)
        return None, (f"the Ray head on {HEAD_IP}:{port} "
                      f"{'ended' if proc.returncode is not None else 'hung'} before it ran "
                      f"(exit {proc.returncode}): {_tail(log)}\n{self.ray_state()}")

    def join(self, host: int, head_address: str, num_cpus: int = 1,
             resources: Mapping[str, float] | None = None, ray_args: Sequence[str] = (),
             env: Mapping[str, str] | None = None,
             log: str | os.PathLike[str] | None = None) -> subprocess.Popen:
        """`raybatch join --address head_address` on `host`, its Ray in the host's /tmp/ray;
        `resources` are added to the node's numa<N> ones."""
        extra = ["--node-ip-address", self.address(host), "--temp-dir", "/tmp/ray",
                 "--object-store-memory", str(OBJECT_STORE_BYTES)]
        if resources:  # one --resources, the last wins: keep the node's numa<N> in it
            from cluster.pinning import sysfs_root
            from cluster.raynode import node_resources
            from cluster.topology import discover

            both = {**node_resources(discover(sysfs_root())), **resources}
            extra += ["--resources", json.dumps(both, sort_keys=True)]
        argv = [*_raybatch(), "join", "--address", head_address, "--num-cpus", str(num_cpus),
                "--", *extra, *ray_args]
        log = log or self.tmp_dir(host) / "raybatch-join.log"
        self.join_logs = {**getattr(self, "join_logs", {}), host: log}
        return self.run(host, argv, env=self.ray_env(env), log=log)

    def wait_nodes(self, head_address: str, count: int,
                   timeout_s: float = 60.0) -> list[dict[str, Any]]:
        """`ray.nodes()` once `count` nodes are alive, from a driver on the head (a process
        of its own: a driver joins one cluster only); TimeoutError if they never are.
        The driver tries `ray.init` again until `timeout_s`, each try given at most a
        third of it: one try's look for its node and its calls to the GCS share one
        budget (`gcs_server_request_timeout_seconds`), so with the lab's 120 s a call
        that hung (or a first look made before any of the lab's raylets ran) left no
        time to try again."""
        per_try = {"RAY_gcs_server_request_timeout_seconds": str(max(10, int(timeout_s / 3)))}
        proc = self.run(None, [sys.executable, "-c", _NODES_DRIVER, head_address, str(count),
                               str(timeout_s)], env=self.ray_env(per_try),
                        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            out, err = proc.communicate(timeout=timeout_s + 60)
        except subprocess.TimeoutExpired:
            proc.kill()
            out, err = proc.communicate()
        lines = [ln for ln in out.splitlines() if ln.startswith("NODES ")]
        if not lines:
            raise LabError(f"the nodes driver failed ({proc.returncode}): {err[-6000:]}\n"
                           f"{self.ray_state()}")
        nodes = json.loads(lines[-1].removeprefix("NODES "))
        if sum(n["Alive"] for n in nodes) < count:
            raise TimeoutError(f"{count} Ray nodes not alive after {timeout_s} s: {nodes}")
        return nodes

    def ray_state(self, chars: int = 2000) -> str:
        """Whether the head's GCS and raylet run and what they and each host's join said
        last, and the load: for an error a Ray of the lab caused (its logs go with the
        lab's temp dirs)."""
        logs = HEAD_RAY_TMP / "session_latest" / "logs"
        out = []
        for name in ("gcs_server", "raylet"):
            running = subprocess.run(["pgrep", "-f", f"{name}.*{HEAD_RAY_TMP}"],
                                     capture_output=True, text=True).stdout.split()
            state = "pid " + " ".join(running) if running else "not running"
            out.append(f"-- the head's {name}: {state}; the end of its log:\n"
                       f"{_tail(logs / f'{name}.out', chars)}")
        for host, log in sorted(getattr(self, "join_logs", {}).items()):
            out.append(f"-- host {host}'s join ({log}):\n{_tail(log, chars)}")
        with contextlib.suppress(OSError):
            out.append(f"-- load average {os.getloadavg()}")
        return "\n".join(out)


def _kill_group(proc: subprocess.Popen) -> None:
    """End `proc` and what it started (its own session: `Lab.run` starts it so)."""
    with contextlib.suppress(ProcessLookupError):
        os.killpg(proc.pid, 9)
    with contextlib.suppress(subprocess.TimeoutExpired):
        proc.wait(10)


def _raybatch() -> list[str]:
    here = Path(sys.executable).parent / "raybatch"
    return [str(here)] if os.access(here, os.X_OK) else [sys.executable, "-m", "raybatch.main"]


def _tail(path: str | os.PathLike[str], chars: int = 3000) -> str:
    with contextlib.suppress(OSError):
        return Path(path).read_text(errors="replace")[-chars:]
    return "(no log)"


_NODES_DRIVER = """
import json, sys, time
import ray
count, give_up = int(sys.argv[2]), time.monotonic() + float(sys.argv[3])
while True:  # a starved head can time out a driver's look for its node: look again
    try:
        ray.init(address=sys.argv[1], log_to_driver=False, logging_level="ERROR")
        break
    except Exception:
        ray.shutdown()
        if time.monotonic() > give_up:  # which raylets a driver here could attach to
            from ray._private.services import find_node_ids
            print("raylets running here:", sorted(find_node_ids()), file=sys.stderr)
            raise
        time.sleep(1)
while sum(n["Alive"] for n in ray.nodes()) < count and time.monotonic() < give_up:
    time.sleep(0.25)
print("NODES " + json.dumps(ray.nodes(), default=str), flush=True)
"""
