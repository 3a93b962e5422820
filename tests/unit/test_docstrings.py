"""Guard: a docstring in the product says why, in words; it quotes no measured speed.

A figure such as "costs ~130 us" or "serves 1.1-3.5x more" was true of one machine on one
day and goes stale without anyone noticing, while the reasoning around it stays right.
Measured figures live where their date, machine and command are kept with them:
`benchmarks/results/` and `docs/performance.md`; a docstring names the benchmark module
that measures the cost it reasons about. Settings are not measurements: a default, a
bound or a timeout ("`link_dead_s` (2 s)", "at most 64 requests", a 2 ms delay) stays.

Read from the source with `ast` (no import runs): every string that stands alone as a
statement in batching/, cluster/ and deployments/, that is each module's, class's and
function's docstring and the attribute docstrings the configuration reference is built
from. A figure is a number with a unit of speed or of CPU cost (µs, items/s, s of CPU),
a millisecond or second figure said to be a cost ("costs", "took", "~"), a percentage of
samples, time or CPU, or a ratio said to be faster, slower, more or less.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("batching", "cluster", "deployments")
VENDORED = ROOT / "deployments" / "http" / "llhttp"

_N = r"\d[\d,.]*(?:\s*(?:-|–|to|->|→)\s*\d[\d,.]*)?"  # 12, 1,500, 1.1-3.5, 12 -> 1
_COST = r"(?:~\s*|about |costs? |took |takes? |spends? |spent |measured )"
MEASURED = re.compile(
    # any microseconds but a bound ("buckets from 100 us") or a quoted example ('420 us')
    rf"(?<!from )(?<!')\b{_N}\s*(?:us|µs|μs)\b"
    rf"|{_COST}{_N}\s*(?:ms|s)\b(?! (?:delay|timeout|bound))"
    rf"|\b{_N}\s*(?:s|seconds) of CPU|\b{_N}\s*CPU-s\b"
    rf"|\b{_N}\s*(?:req|requests|items|answers|tokens|MB|GB|KB)(?:/s\b| a second| per second)"
    rf"|\b{_N}\s*%\s+of\s+(?:\S+\s+){{0,4}}?(?:samples|time|CPU)\b"
    rf"|\b{_N}\s*(?:[x×]|times)\s+(?:faster|slower|more|less|fewer|of)\b",
    re.IGNORECASE)


def _modules():
    for pkg in PACKAGES:
        for path in sorted((ROOT / pkg).rglob("*.py")):
            if VENDORED not in path.parents:
                yield path


def _figures(path: Path) -> list[str]:
    """`line: text` of each figure in a docstring of `path`."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if not (isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant)
                and isinstance(node.value.value, str)):
            continue
        for n, line in enumerate(node.value.value.splitlines()):
            if MEASURED.search(line):
                found.append(f"{node.lineno + n}: {line.strip()[:100]}")
    return found


def test_no_docstring_quotes_a_measured_speed():
    bad = [f"{path.relative_to(ROOT).as_posix()}:{f}" for path in _modules()
           for f in _figures(path)]
    assert bad == [], ("say why in words and name the benchmark that measures it; the "
                       "figure goes to docs/performance.md:\n" + "\n".join(bad))


def test_the_guard_catches_what_it_is_for():
    for text in ("spends ~130 us of its process's CPU", "12 -> 1 us for 256 values",
                 "serve 1.1-3.5x more", "15,545 req/s", "costs about 0.6 ms of the caller's",
                 "1.5-2.3 s of CPU each", "pickles ~15x faster", "39% of an ingress replica's"
                 " samples", "4,800 requests a second", "the first batches measured 36-74 ms",
                 "took 94 us", "2.5× of the ceiling"):
        assert MEASURED.search(text), text
    for text in ("`link_dead_s` (2 s)", "`max_queue_delay_s`=0.002", "at most 64 requests",
                 "10,000 connections", "a 2 ms delay fires 2 to 3 ms later",
                 "histogram buckets from 100 us to 30 s", "0.00042 -> '420 us'",
                 "16 x max_batch_size", "64 x 256 floats", "at 10x overload",
                 "30 s by default", "100% of 64", "HTTP/1.1 200"):
        assert not MEASURED.search(text), text
