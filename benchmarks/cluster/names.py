"""What every part of the lab shares: the names it gives, the head's address, its error.

What it decides: every object the lab makes (netns, link, cgroup, mount, /tmp directory) is
named `rblab-*`, so that a sweep can find all of them by the name alone; the head is
198.18.0.1 (the bridge's address in the root namespace); a command that fails raises
LabError with the command and its stderr, never a return code to check.
"""

from __future__ import annotations

import shlex
import subprocess
from pathlib import Path

PREFIX = "rblab-"
HEAD_IP = "198.18.0.1"
LAB_DIR = Path(f"/tmp/{PREFIX}lab")  # the lab's own files (default logs)


class LabError(RuntimeError):
    """A lab could not be made, or a command on it failed (the command and its stderr)."""


def sh(*argv: str, check: bool = True) -> str:
    """Run `argv`, return its stdout; LabError if it fails (unless `check` is False)."""
    proc = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if check and proc.returncode != 0:
        raise LabError(f"`{shlex.join(argv)}` failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout
