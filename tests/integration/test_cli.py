"""The `raybatch` command line against real Ray: `status` on the running app. (`up` as a user
runs it, a local Ray of its own: tests/integration/test_up_stop.py.)"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest

from tests.conftest import ROOT

pytestmark = pytest.mark.integration


def raybatch(*args: str, env: dict | None = None, timeout_s: float = 120):
    exe = shutil.which("raybatch", path=os.path.dirname(sys.executable))
    cmd = [exe] if exe else [sys.executable, "-m", "raybatch"]
    return subprocess.run([*cmd, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout_s, env=env)


def test_status_json_reports_every_model_of_the_running_app(app):
    proc = raybatch("status", "--json", "--address", app.gcs_address, "--app", app.name)
    assert proc.returncode == 0, proc.stderr[-3000:]
    stats = json.loads(proc.stdout)
    assert sorted(stats) == sorted(m.name for m in app.config.models)
    assert stats["slowsquare"]["replicas"] == 2
    for model, s in stats.items():
        want = app.config.model(model).replicas.min_replicas
        assert len(s["replica_info"]) == s["replicas"] >= want
        assert {r["state"] for r in s["replica_info"]} == {"ALIVE"}, s["replica_info"]
        if s["kind"] == "iterative":
            assert {"steps", "waiting", "active", "completed"} <= set(s)
        else:
            assert {"batches", "by_reason", "queued_requests"} <= set(s)


def test_status_prints_replicas_and_batches_for_people(app):
    proc = raybatch("status", "--address", app.gcs_address, "--app", app.name)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = proc.stdout
    assert re.search(r"^slowsquare: 2 replicas, queued \d+ requests", out, re.M), out
    assert re.search(r"^  replica-\d+: ALIVE, node \w+ cpus \[", out, re.M), out
    # slowsquare's replica actors read ahead (tests/configs/app.yaml): status says so
    at = next(i for i, line in enumerate(out.splitlines()) if line.startswith("slowsquare:"))
    assert all("reads ahead" in line for line in out.splitlines()[at + 2:at + 4]), out
    # square's replica runs in the ingress (replicas.in_process): status says so
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.startswith("square:"))
    square = lines[at + 1:at + 4]
    assert any(re.search(r"replica-0: ALIVE, .* in process gpus", line) for line in square), out
    assert "WARNING" not in proc.stdout + proc.stderr, proc.stderr[-2000:]
