"""A pytest plugin that says what each test cost the machine: its wall time and the CPU
seconds every process on the machine used meanwhile (Ray's processes included, which a
test's own process accounting misses). Meaningful when nothing else runs; for finding
where the suite's time goes on a small machine:

    .venv/bin/python -m pytest -p tests.cpu_profile tests/integration ...

prints the 40 costliest at the end (RAYBATCH_CPU_PROFILE_TOP to change) and writes them
all, as JSON lines, to RAYBATCH_CPU_PROFILE when it is set."""

from __future__ import annotations

import json
import os
import time

import psutil
import pytest

_rows: list[dict] = []


def _busy() -> float:
    t = psutil.cpu_times()
    return t.user + t.system + t.nice + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    cpu, wall = _busy(), time.monotonic()
    yield
    _rows.append({"test": item.nodeid, "cpu_s": round(_busy() - cpu, 2),
                  "wall_s": round(time.monotonic() - wall, 2)})


def pytest_terminal_summary(terminalreporter):
    if not _rows:
        return
    top = int(os.environ.get("RAYBATCH_CPU_PROFILE_TOP", "40"))
    write = terminalreporter.write_line
    write(f"---- machine CPU by test: {sum(r['cpu_s'] for r in _rows):.0f} CPU-s in "
          f"{sum(r['wall_s'] for r in _rows):.0f} s over {len(_rows)} tests ----")
    for r in sorted(_rows, key=lambda r: -r["cpu_s"])[:top]:
        write(f"{r['cpu_s']:7.1f} CPU-s {r['wall_s']:7.1f} s  {r['test']}")
    path = os.environ.get("RAYBATCH_CPU_PROFILE")
    if path:
        with open(path, "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in _rows)
