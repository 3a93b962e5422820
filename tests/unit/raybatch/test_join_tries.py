"""`raybatch join` starts its node again when `ray start` missed Ray's fixed startup waits:
what the failed try left is ended first; any other failure is its exit status at once."""

from __future__ import annotations

import os
import sys

import psutil

from cluster.localray import TRIES
from raybatch.join import run_node
from tests.conftest import HANG_S

# Stands in for `ray start --block`: each run appends its pid to CALLS and starts an orphan
# (`sleep`, as an agent whose raylet died), recorded in ORPHANS; it then fails with Ray's
# words while runs remain in FAILS (the first FAILS runs), else with EXIT.
FAKE_RAY_START = """
import os, subprocess, sys
calls, orphans, fails, code = sys.argv[1:5]
with open(calls, "a") as f:
    f.write(f"{os.getpid()}\\n")
n = len(open(calls).read().split())
held = os.environ.get("HOLD_PIPE") == "1"  # else its output goes elsewhere, as Ray's does
orphan = subprocess.Popen(["sh", "-c", "sleep 300 >/dev/null " + ("" if held else "2>&1 ")
                           + "& echo $!"], stdout=subprocess.PIPE, text=True)
with open(orphans, "a") as f:
    f.write(orphan.communicate()[0])
if n <= int(fails):
    print("RuntimeError: The current node timed out during startup.", flush=True)
    sys.exit(1)
print("Ray runtime started.", flush=True)
sys.exit(int(code))
"""


def fake(tmp_path, fails: int, code: int = 0) -> tuple[list[str], object, object]:
    calls, orphans = tmp_path / "calls", tmp_path / "orphans"
    return ([sys.executable, "-c", FAKE_RAY_START, str(calls), str(orphans), str(fails),
             str(code)], calls, orphans)


def orphans_of(path) -> list[psutil.Process]:
    out = []
    for pid in path.read_text().split():
        try:
            out.append(psutil.Process(int(pid)))
        except psutil.NoSuchProcess:
            out.append(None)
    return out


def gone(p) -> bool:
    if p is None:
        return True
    try:
        return p.status() == psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return True


def end(orphans) -> None:
    for p in orphans:
        try:
            p and p.kill()
        except psutil.Error:
            pass


def test_a_node_that_missed_rays_waits_is_started_again_and_its_leftovers_ended(
        tmp_path, capsys):
    argv, calls, orphans = fake(tmp_path, fails=1)
    try:
        assert run_node(argv, dict(os.environ)) == 0
        assert len(calls.read_text().split()) == 2
        first, second = orphans_of(orphans)
        psutil.wait_procs([p for p in (first,) if p], timeout=HANG_S)
        assert gone(first) and not gone(second)  # the failed try's only
        out = capsys.readouterr().out
        assert "timed out during startup" in out and "Ray runtime started." in out  # relayed
        assert "try 1 of 3" in out and "starting it again" in out
    finally:
        end(orphans_of(orphans))


def test_any_other_failure_and_the_last_timeout_are_the_exit_status(tmp_path, capsys):
    argv, calls, orphans = fake(tmp_path, fails=0, code=3)
    try:
        assert run_node(argv, dict(os.environ)) == 3  # not Ray's words: not tried again
        assert len(calls.read_text().split()) == 1
        calls.unlink()
        argv, calls, _ = fake(tmp_path, fails=TRIES)
        assert run_node(argv, dict(os.environ)) == 1
        assert len(calls.read_text().split()) == TRIES
        assert f"try {TRIES - 1} of {TRIES}" in capsys.readouterr().out
    finally:
        end(orphans_of(orphans))


def test_a_leftover_that_holds_the_output_open_does_not_hold_join_up(tmp_path):
    argv, calls, orphans = fake(tmp_path, fails=1)
    try:
        assert run_node(argv, {**os.environ, "HOLD_PIPE": "1"}) == 0
        assert len(calls.read_text().split()) == 2
    finally:
        end(orphans_of(orphans))
