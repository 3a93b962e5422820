"""The suite's CPU-by-process tool charges each command line to the right kind."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.cpu_by_process import _processes, kind, main

VENV = "/repo/.venv/lib/python3.11/site-packages/ray"


@pytest.mark.parametrize(("cmdline", "expected"), [
    (f"/repo/.venv/bin/python {VENV}/_private/workers/default_worker.py --node-ip-address=1 "
     "--raylet-name=/tmp/ray/session/sockets/raylet", "Ray worker start-up"),
    ("ray::IDLE", "Ray worker start-up"),
    ("ray::ServeController", "Serve controller and proxies"),
    ("ray::SERVE_PROXY_ACTOR-fallback-d86f", "Serve controller and proxies"),
    (f"{VENV}/core/src/ray/gcs/gcs_server --log_dir=/tmp/ray", "Ray's per-node processes"),
    (f"{VENV}/core/src/ray/raylet/raylet --raylet_socket_name=x", "Ray's per-node processes"),
    ("ray::DashboardAgent", "Ray's per-node processes"),
    (f"/repo/.venv/bin/python -u {VENV}/_private/log_monitor.py --logs-dir=x",
     "Ray's per-node processes"),
    ("ray::SERVE_REPLICA::raybatch-test#Ingress#xp17", "the apps' actors"),
    ("ray::BatcherActor", "the apps' actors"),
    ("/repo/.venv/bin/python -m pytest -q tests/unit", "pytest"),
    ("/repo/.venv/bin/python /repo/.venv/bin/raybatch up --config x.yaml",
     "raybatch command lines"),
    ("/repo/.venv/bin/python -m ipykernel_launcher -f k.json", "notebook kernels"),
    ("/bin/sleep 5", "other"),
])
def test_each_command_line_is_charged_to_its_kind(cmdline, expected):
    assert kind(cmdline) == expected


def test_it_runs_the_command_and_returns_its_exit_status(capsys):
    rc = main(["--", sys.executable, "-c", "sum(range(10**6)); raise SystemExit(3)"])
    assert rc == 3
    out = capsys.readouterr().out
    assert "CPU by kind of process" in out and "the costliest command lines" in out


def test_no_command_is_refused():
    with pytest.raises(SystemExit):
        main(["--"])


def test_a_process_is_charged_by_its_whole_command_line_not_its_shortened_title():
    """A Ray worker's command line names default_worker.py after a long path: past the
    shortened title shown in the list, still its kind."""
    long_path = "/x" * 60 + "/ray/_private/workers/default_worker.py"
    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(30)", long_path])
    try:
        [(title, what)] = [(t, k) for (pid, _), _, t, k in _processes() if pid == proc.pid]
        assert "default_worker.py" not in title and what == "Ray worker start-up"
    finally:
        proc.kill()
        proc.wait()
