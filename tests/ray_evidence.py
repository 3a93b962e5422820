"""What Ray itself did to a test run, read from a Ray session's log folder: printed at the
end of a run that failed, since none of it reaches a test's own output. A test that hangs
because Ray's memory monitor killed Serve's controller (memory taken by something else on
the machine) otherwise reads as a hang in the test; here it reads as what it was.

    workers Ray's memory monitor killed (the node's memory use, each one's task)
    Serve controllers started (more than one: the controller died and was restarted)
    the last WARNING and ERROR lines of the latest controller's log
"""

from __future__ import annotations

import re
from pathlib import Path

_KILLING = re.compile(r"Killing (\d+) worker\(s\), kill details: (.*)")
_SELECTED = re.compile(r"Selected to kill: .*?task name=([^,]+),.*?pid=(\d+)")


def _lines(path: Path) -> list[str]:
    try:
        return path.read_text(errors="replace").splitlines()
    except OSError:
        return []


def summary(logs: Path, tail: int = 10) -> list[str]:
    """Lines saying what Ray did in the session whose log folder is `logs` (none: nothing)."""
    out: list[str] = []
    for line in _lines(logs / "raylet.out"):
        if m := _KILLING.search(line):
            out.append(f"Ray's memory monitor killed {m.group(1)} worker(s): {m.group(2)}")
        elif m := _SELECTED.search(line):
            out.append(f"  killed: {m.group(1)} (pid {m.group(2)})")
    if len(out) > 3 * tail:
        out[3 * tail:] = [f"  ... and {len(out) - 3 * tail} lines more of kills in "
                          f"{logs / 'raylet.out'}"]
    controllers = sorted((logs / "serve").glob("controller_[0-9]*.log"),
                         key=lambda p: p.stat().st_mtime)
    if len(controllers) > 1:
        out.append(f"Serve's controller started {len(controllers)} times (it died and Ray "
                   f"restarted it): {', '.join(p.name for p in controllers)}")
    if controllers:
        flagged = [line for line in _lines(controllers[-1])
                   if line.startswith(("WARNING", "ERROR"))][-tail:]
        if flagged:
            out.append(f"the last WARNING and ERROR lines of {controllers[-1].name}:")
            out += ["  " + line[:300] for line in flagged]
    if out:
        out.insert(0, f"---- what Ray did in the session ({logs}) ----")
    return out
