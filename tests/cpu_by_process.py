"""Where a command's CPU goes on the machine, by kind of process: Ray's worker start-up, its
per-node processes, Serve's controller and proxies, the apps' actors, pytest, the
`raybatch` command lines, the setup. For a whole suite, where a per-test account (the
`tests.cpu_profile` plugin) cannot say which processes a shorter suite would have to
start less often:

    .venv/bin/python -m tests.cpu_by_process -- bash .ci/run

Every process's CPU time is read from /proc once a second and charged to the kind its
command line says it is at that moment (a Ray worker is "starting" until it names itself
after its actor); a process already running when the command starts counts from then on.
One that lives less than a second is missed, and so is each process's last second before
it exits: an undercount, the larger for many short processes. Meaningful when nothing else
runs. Prints the kinds, then the 25 costliest command lines; the command's exit status
is this one's.
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import subprocess
import sys
import threading

import psutil

KINDS = [  # (kind, what the command line contains), the first match wins
    ("Ray worker start-up", ("default_worker.py", "ray::IDLE")),
    ("Serve controller and proxies", ("ServeController", "SERVE_CONTROLLER", "ProxyActor",
                                      "PROXY_ACTOR", "HAProxy", "haproxy")),
    ("Ray's per-node processes", ("gcs_server", "/raylet", "DashboardAgent", "dashboard/",
                                  "RuntimeEnvAgent", "runtime_env/", "log_monitor",
                                  "autoscaler/_private/monitor", "ray.util.client",
                                  "ray start")),
    ("the apps' actors", ("ray::",)),
    ("pytest", ("pytest",)),
    ("raybatch command lines", ("raybatch",)),
    ("setup", ("pip", "/uv ", "cc1", "mkdocs", "ruff")),
    ("notebook kernels", ("ipykernel",)),
]


def kind(cmdline: str) -> str:
    for name, marks in KINDS:
        if any(m in cmdline for m in marks):
            return name
    return "other"


def _title(cmd: str, p: psutil.Process) -> str:
    if cmd.startswith("ray::"):  # an actor's or task's name, not its arguments
        return re.split(r"[ (]", cmd, maxsplit=1)[0][:70]
    return cmd[:70] or f"[{p.name()}]"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run")
    args = ap.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("give the command to run after --")
    # a process is its pid and start time (a pid is reused); CPU it had before we began,
    # not counted
    seen: dict[tuple[int, float], float] = {k: cpu for k, cpu, _, _ in _processes()}
    by_kind: collections.Counter[str] = collections.Counter()
    by_title: collections.Counter[str] = collections.Counter()
    done = threading.Event()

    def take() -> None:
        for key, used, title, what in _processes():
            delta, seen[key] = used - seen.get(key, 0.0), used
            if delta > 0 and key[0] != os.getpid():
                by_kind[what] += delta
                by_title[title] += delta

    def sample() -> None:
        while not done.wait(1.0):
            take()

    thread = threading.Thread(target=sample, daemon=True)
    thread.start()
    rc = subprocess.call(command)
    done.set()
    thread.join()
    take()  # what the processes still there used since the last look
    total = sum(by_kind.values())
    print(f"---- CPU by kind of process: {total:.0f} CPU-s ----")
    for name, cpu in by_kind.most_common():
        print(f"{cpu:8.1f}  {name}")
    print("---- the costliest command lines ----")
    for title, cpu in by_title.most_common(25):
        print(f"{cpu:8.1f}  {title}")
    return rc


def _processes() -> list[tuple[tuple[int, float], float, str, str]]:
    """(pid and start time, CPU seconds so far, title, kind) of every process still there;
    the kind from the whole command line (a title is cut short: a Ray worker's path to
    default_worker.py is longer than one)."""
    out = []
    for p in psutil.process_iter():
        try:
            t = p.cpu_times()
            cmd = " ".join(p.cmdline())
            out.append(((p.pid, p.create_time()), t.user + t.system, _title(cmd, p), kind(cmd)))
        except (psutil.Error, OSError):  # gone meanwhile, or not ours to read
            continue
    return out


if __name__ == "__main__":
    sys.exit(main())
