"""Guard: no internal work-tracking name in the product. A numbered session, round or
issue means nothing to a reader outside the team that worked in them (the repository has
no issue tracker): results are named by date and what they measure, tests by what they
check, targets by what they are.

Every text file of the repository is read (code, tests, docs, notebooks, benchmark code
and results), and every path; `.git`, virtual environments, caches and the built site are
left out.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SKIP_DIRS = {".git", ".venv", "venv", "site", "__pycache__", ".pytest_cache", ".ruff_cache",
             ".hypothesis", ".ipynb_checkpoints", "node_modules", "build", "dist",
             ".peers", ".gpu"}  # the peers' venvs (benchmarks.peers), the GPU kit's build
# Built from parts, so that this file does not name what it forbids.
_WORDS = "|".join(("sess" + "ion", "iss" + "ue", "rou" + "nd"))
INTERNAL = re.compile(rf"\b(?:{_WORDS})[ _-]?#?\d+\b|\bthe {'iss' + 'ue'}\b(?!s)|\bwip/",
                      re.IGNORECASE)
# Third-party programs kept byte for byte as their authors wrote them.
VENDORED = ROOT / "tests" / "e2e" / "triton_examples"


def _skipped(name: str) -> bool:
    return name in SKIP_DIRS or name.endswith(".egg-info")


def _files():
    """Every file left in, in path order. Walked with the skipped folders pruned, never
    entered (the virtual environment alone holds tens of thousands of files)."""
    found = []
    for folder, subfolders, names in os.walk(ROOT, followlinks=True):
        here = Path(folder)
        subfolders[:] = [d for d in subfolders if not _skipped(d) and here / d != VENDORED]
        found += [here / n for n in names if not _skipped(n) and (here / n).is_file()]
    yield from sorted(found)


def test_no_path_is_named_after_an_internal_round():
    bad = [str(p.relative_to(ROOT)) for p in _files()
           if INTERNAL.search(str(p.relative_to(ROOT)).replace("/", " "))]
    assert bad == [], "name these by date and what they hold, e.g. results/2026-11-25-front/"


def test_no_text_cites_an_internal_round():
    bad = []
    for path in _files():
        if path == Path(__file__).resolve():
            continue  # its own examples, below
        try:
            text = path.read_text()
        except (UnicodeDecodeError, OSError):
            continue  # binary
        for n, line in enumerate(text.splitlines(), 1):
            if INTERNAL.search(line):
                bad.append(f"{path.relative_to(ROOT)}:{n}: {line.strip()[:100]}")
    assert bad == [], "say what it is, not which round it came from:\n" + "\n".join(bad)


def test_the_guard_catches_what_it_is_for():
    for text in ("Session 9's figures", "results/session4/", "issue 10's targets",
                 "the issue's full run", "Round 3", "wip/perf"):
        assert INTERNAL.search(text), text
    for text in ("one local Ray per test session", "a round trip", "ABBA rounds",
                 "SessionName", "to issue all the requests"):
        assert not INTERNAL.search(text), text
