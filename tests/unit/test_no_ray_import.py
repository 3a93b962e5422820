"""Guard: the batching engine never imports Ray (it must run in-process and in the simulator)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# A fresh interpreter: this test process may have loaded Ray for other tests already.
SCRIPT = """
import importlib, pkgutil, sys
import batching
names = sorted(m.name for m in pkgutil.walk_packages(batching.__path__, "batching.")
               if not m.name.endswith("__main__"))
for name in names:
    importlib.import_module(name)
batching.__getattr__("BatchedService")  # the lazily loaded embedded host
print("IMPORTED:" + ",".join(names))
print("RAY:" + ",".join(sorted(m for m in sys.modules if m == "ray" or m.startswith("ray."))))
"""


def test_importing_batching_does_not_load_ray():
    proc = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True,
                          text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    imported, ray = proc.stdout.strip().splitlines()[-2:]
    for module in ("batching.ledger", "batching.dynamic.batcher", "batching.sequence.host",
                   "batching.iterative.scheduler", "batching.embedded.service",
                   "batching.simulate.engine"):
        assert module in imported.split(":", 1)[1].split(","), imported
    assert ray == "RAY:", ray
