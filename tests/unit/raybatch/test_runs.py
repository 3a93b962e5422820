"""A run's processes are found by the id in their environment and ended, including one
started between the scan and the kill (a second Ctrl-C while Serve deployed left its
HAProxy behind, with no record left to find it by), and `raybatch down` ends a dead run's.
Real processes, this user's only."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid

from raybatch import runs
from tests.conftest import wait_until

SLEEPER = [sys.executable, "-c", "import time; time.sleep(60)"]


def _start(run_id: str) -> subprocess.Popen:
    return subprocess.Popen(SLEEPER, env={**os.environ, runs.RUN_ENV: run_id})


def _carrying_the_id(proc: subprocess.Popen, run_id: str, scan) -> subprocess.Popen:
    """`proc` once `scan` (`runs.processes_of`, unpatched) finds it. A process that a
    run's process starts inherits the id from the moment it forks; this one, started by
    the test with an environment of its own, shows it only once it has exec'd (a loaded
    machine once took longer than the kill's rescans between the two)."""
    wait_until(lambda: any(p.pid == proc.pid for p in scan(run_id)),
               timeout_s=30, what=f"pid {proc.pid} to show the run's id in its environment")
    return proc


def test_kill_now_ends_the_runs_processes_and_what_they_started_meanwhile(monkeypatch):
    run_id = uuid.uuid4().hex
    scan = runs.processes_of
    # seen by a scan before the kill: under a CPU hog the kill once did not end it (its
    # wait ran out), most likely because the kill's first scan had not found it
    first = _carrying_the_id(_start(run_id), run_id, scan)
    other = _start(uuid.uuid4().hex)
    late: list[subprocess.Popen] = []

    def scan_then_spawn(rid: str) -> list:
        found = scan(rid)
        if not late:  # started after this scan, before the kill
            late.append(_carrying_the_id(_start(run_id), run_id, scan))
        return found

    monkeypatch.setattr(runs, "processes_of", scan_then_spawn)
    try:
        runs.kill_now(run_id)
        assert first.wait(timeout=30) == -9  # a hang guard: a SIGKILL ends it at once
        assert late[0].wait(timeout=30) == -9
        assert other.poll() is None  # another run's process is left alone
    finally:
        for p in (first, other, *late):
            p.kill()
            p.wait()


def test_down_ends_what_a_dead_run_left_and_forgets_it(tmp_path, monkeypatch, capsys):
    """A run whose `up` is gone (its pid ended) but whose process lives on (as Serve's
    HAProxy outlives a killed `up`): `raybatch down` ends that process, names it, and
    forgets the run; a process of no recorded run is left alone."""
    monkeypatch.setenv(runs.STATE_DIR_ENV, str(tmp_path))
    gone = subprocess.Popen([sys.executable, "-c", "pass"])
    gone.wait()
    dead = runs.Run(uuid.uuid4().hex, gone.pid, 0.0)  # no live process has this start time
    dead.save()
    left = _carrying_the_id(_start(dead.run_id), dead.run_id, runs.processes_of)
    other = _start(uuid.uuid4().hex)
    try:
        assert not dead.alive()
        assert runs.down(object()) == 0
        assert left.wait(timeout=30) is not None
        said = capsys.readouterr().out
        assert f"  ending {os.path.basename(sys.executable)} (pid {left.pid})" in said, said
        assert "raybatch down: 1 run(s) ended" in said, said
        assert runs.runs() == [] and runs.processes_of(dead.run_id) == []
        assert other.poll() is None
    finally:
        for p in (left, other):
            p.kill()
            p.wait()


def test_kill_now_looks_again_after_its_first_kill_however_slow_the_scan(monkeypatch):
    # the rescans' time counted from before the first scan: a scan slower than it (a busy
    # machine) ended the kill before it looked for what started meanwhile
    clock = iter(range(0, 1000, 5))  # every reading of the clock 5 s after the last
    monkeypatch.setattr(runs.time, "monotonic", lambda: float(next(clock)))
    monkeypatch.setattr(runs.time, "sleep", lambda s: None)
    killed: list[str] = []

    class Proc:
        def __init__(self, name: str) -> None:
            self.name = name

        def kill(self) -> None:
            killed.append(self.name)

    scans = iter([[Proc("first")], [Proc("late")], []])
    monkeypatch.setattr(runs, "processes_of", lambda rid: next(scans))
    runs.kill_now("r", rescan_s=1.0)
    assert killed == ["first", "late"]
