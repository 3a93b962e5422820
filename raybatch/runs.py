"""What a local `raybatch up` leaves behind, and how the next one (or `raybatch down`)
ends it without touching anything else.

A local `up` starts Ray in its own process; Ray's raylet and GCS die with it, but some
of what they started does not: Serve's HAProxy (a child of the Serve controller, holding
the HTTP and gRPC ports and HAProxy's 8404 and 9101) and Ray's agents outlive a killed
`up` (SIGKILL, OOM, a closed terminal), and the next `up` cannot bind its ports.

So each local run is recorded: a file per run in `state_dir()` (its id, the `up`'s pid
and start time, its ports), and the run's id in the environment of the `up` process
(`RUN_ENV`), which every process Ray starts for it inherits, HAProxy included. A process
is this run's only if its environment says so: that is the proof, never a name or a
port. A run whose `up` is gone has left leftovers; those are ended (SIGTERM, then
SIGKILL). A port held by anything else is refused with its pid and the command to end it.
"""

from __future__ import annotations

import json
import os
import signal
import time
import uuid
from collections.abc import Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path

import psutil

from cluster.localray import end, processes_with

RUN_ENV = "RAYBATCH_RUN_ID"
"""Environment variable naming the run a process belongs to."""
STATE_DIR_ENV = "RAYBATCH_STATE_DIR"
HAPROXY_PORTS = (8404, 9101)
"""Serve's HAProxy stats and metrics ports (RAY_SERVE_HAPROXY_STATS_PORT, _METRICS_PORT)."""


class PortsTaken(RuntimeError):
    """A port `up` needs is held by something it cannot prove is a dead run's leftover."""


def state_dir() -> Path:
    """Where runs are recorded: $RAYBATCH_STATE_DIR, else /tmp/raybatch-<uid>."""
    return Path(os.environ.get(STATE_DIR_ENV) or f"/tmp/raybatch-{os.getuid()}")


@dataclass
class Run:
    run_id: str
    pid: int
    started: float
    """The `up` process's create time (psutil), so a reused pid is not taken for it."""
    ports: list[int] = field(default_factory=list)
    config: str = ""

    @property
    def path(self) -> Path:
        return state_dir() / f"run-{self.run_id}.json"

    def alive(self) -> bool:
        """Whether this run's `up` is still running."""
        try:
            p = psutil.Process(self.pid)
            return (abs(p.create_time() - self.started) < 1.0
                    and p.status() != psutil.STATUS_ZOMBIE)
        except psutil.Error:
            return False

    def save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(asdict(self)))
        tmp.replace(self.path)

    def forget(self) -> None:
        self.path.unlink(missing_ok=True)


def begin_run(ports: Iterable[int], config: str = "") -> Run:
    """Record this process as a run and mark its environment (before Ray starts)."""
    me = psutil.Process()
    run = Run(uuid.uuid4().hex, me.pid, me.create_time(), sorted(set(ports)), config)
    os.environ[RUN_ENV] = run.run_id
    run.save()
    return run


def runs() -> list[Run]:
    """Every recorded run, live or not (unreadable records are dropped)."""
    found = []
    for path in sorted(state_dir().glob("run-*.json")):
        try:
            found.append(Run(**json.loads(path.read_text())))
        except (OSError, ValueError, TypeError):
            path.unlink(missing_ok=True)
    return found


def processes_of(run_id: str) -> list[psutil.Process]:
    """This user's processes whose environment names `run_id` (never this one)."""
    return processes_with(RUN_ENV, run_id)


def describe(p: psutil.Process) -> str:
    try:
        name = " ".join(p.cmdline()[:1]) or p.name()
        ports = sorted({c.laddr.port for c in p.net_connections("tcp")
                        if c.status == psutil.CONN_LISTEN})
    except psutil.Error:
        return f"pid {p.pid}"
    where = f", ports {', '.join(map(str, ports))}" if ports else ""
    return f"{os.path.basename(name)} (pid {p.pid}{where})"


RESCAN_S = 1.0  # how long the run's processes are looked for again after a kill


def kill_now(run_id: str, rescan_s: float = RESCAN_S) -> None:
    """SIGKILL every process of `run_id` at once (a second Ctrl-C), and whatever they
    started meanwhile: a process spawned between the scan and the kill (Serve's HAProxy,
    started by its controller while it deployed) was left holding its ports. Looks again
    until none is found or `rescan_s` passed since the first kill (at least once more
    after it, however long a scan takes on a busy machine)."""
    deadline = None
    while procs := processes_of(run_id):
        for p in procs:
            try:
                p.kill()
            except psutil.Error:
                pass
        if deadline is None:
            deadline = time.monotonic() + rescan_s
        elif time.monotonic() > deadline:
            return
        time.sleep(0.05)


def end_run(run_id: str, procs: list[psutil.Process] | None = None,
            grace_s: float = 2.0) -> None:
    """End the processes of `run_id` (`procs` if already found) as `end` does, then
    whatever they started while they were ending (`kill_now`)."""
    end(processes_of(run_id) if procs is None else procs, grace_s)
    kill_now(run_id)


def clean_dead_runs() -> list[str]:
    """End the processes of every recorded run whose `up` is gone, and forget the run.
    Returns what was ended, for the user."""
    ended = []
    for run in runs():
        if run.alive():
            continue
        procs = processes_of(run.run_id)
        ended += [describe(p) for p in procs]
        end_run(run.run_id, procs)
        run.forget()
    return ended


def check_ports(ports: Iterable[int]) -> None:
    """Raise PortsTaken naming each port in `ports` that something listens on, who holds
    it and the command that ends it."""
    wanted = set(ports)
    holders: dict[int, int | None] = {}
    for c in psutil.net_connections("tcp"):
        if c.status == psutil.CONN_LISTEN and c.laddr.port in wanted:
            holders.setdefault(c.laddr.port, c.pid)
    if not holders:
        return
    live = {r.pid: r for r in runs() if r.alive()}
    lines = []
    for port, pid in sorted(holders.items()):
        lines.append(f"  port {port}: " + _holder(pid, live))
    raise PortsTaken("ports this run needs are taken:\n" + "\n".join(lines) +
                     "\nor choose other ports (--port, --grpc-port, --native-port)")


def _holder(pid: int | None, live: dict[int, Run]) -> str:
    if pid is None:
        return ("held by another user's process; `sudo ss -ltnp` names it, end it with "
                "`sudo kill <pid>`")
    try:
        env_run = psutil.Process(pid).environ().get(RUN_ENV)
    except psutil.Error:
        env_run = None
    owner = next((r for r in live.values() if r.run_id == env_run), live.get(pid))
    if owner is not None:
        return (f"{describe(psutil.Process(pid))}, of a running `raybatch up` (pid "
                f"{owner.pid}): stop it with Ctrl-C in its terminal, `kill -INT {owner.pid}` "
                "or `raybatch down`")
    try:
        cmd = " ".join(psutil.Process(pid).cmdline())[:120]
    except psutil.Error:
        cmd = "?"
    return f"held by pid {pid} ({cmd}): end it with `kill {pid}`"


def down(args: object) -> int:
    """`raybatch down`: stop every running local `raybatch up` (as Ctrl-C does, then
    SIGKILL past `--timeout`) and end every process a run left behind."""
    timeout_s = float(getattr(args, "timeout", 20.0))
    found = runs()
    for run in found:
        if run.alive():
            print(f"stopping the running `raybatch up` (pid {run.pid})", flush=True)
            os.kill(run.pid, signal.SIGINT)
            if not _wait_dead(run, timeout_s):
                print(f"  still running after {timeout_s:g} s: killing it", flush=True)
                os.kill(run.pid, signal.SIGKILL)
                _wait_dead(run, 5.0)
        procs = processes_of(run.run_id)
        for p in procs:
            print(f"  ending {describe(p)}", flush=True)
        end_run(run.run_id, procs)
        run.forget()
    print(f"raybatch down: {len(found)} run(s) ended" if found else
          f"raybatch down: no run recorded in {state_dir()}", flush=True)
    return 0


def _wait_dead(run: Run, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while run.alive():
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)
    return True
