"""`python -m raybatch.bytecode`: compile to bytecode what a running Raybatch imports, at
setup, once: the installed distributions that Raybatch's own requirements pull in (ray with
its serve extra, torch, numpy, pydantic, ... and theirs), and the project's own packages.

Why: where PYTHONDONTWRITEBYTECODE is set (as on many CI and container images), a process
that imports a module without a cached .pyc parses its source, every time: each Ray worker
would parse Ray's and torch's modules again at every start, in about twice the time.
Why not everything installed (`pip`, `uv --compile-bytecode`): the venv also holds the test,
notebook, embedding and docs extras (transformers, openai, scipy, sympy's users, ...), as
many files again that the running product never imports, whose compiling was most of a
fresh setup's time on a small machine. Those compile on first import where writing
bytecode is allowed (the test runner allows it).
"""

from __future__ import annotations

import compileall
import importlib.metadata as md
import os
import sys
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

ROOT = Path(__file__).resolve().parent.parent
OWN_PACKAGES = ("batching", "cluster", "deployments", "raybatch")


def runtime_distributions(top: str = "raybatch") -> dict[str, md.Distribution]:
    """`top` and every installed distribution its requirements (no extras of its own; the
    extras its requirements name, such as ray[serve], followed) pull in, by name."""
    found: dict[str, md.Distribution] = {}
    extras_seen: dict[str, set[str]] = {}

    def walk(name: str, extras: set[str]) -> None:
        key = canonicalize_name(name)
        new = ({""} | extras) - extras_seen.get(key, set())
        if not new:
            return
        try:
            dist = found.get(key) or md.distribution(name)
        except md.PackageNotFoundError:  # an optional platform's requirement: not here
            return
        found[key] = dist
        extras_seen.setdefault(key, set()).update(new)
        for line in dist.requires or []:
            req = Requirement(line)
            if any(req.marker is None or req.marker.evaluate({"extra": e}) for e in new):
                walk(req.name, set(req.extras))

    walk(top, set())
    return found


def runtime_files(top: str = "raybatch") -> list[Path]:
    """The .py files of `top`'s runtime distributions (as their RECORDs list them: a
    distribution's scripts outside its site-packages are left out) and of the project's
    own packages."""
    files: set[Path] = set()
    for dist in runtime_distributions(top).values():
        base = Path(dist.locate_file("")).resolve()
        for f in dist.files or []:
            if f.suffix == ".py" and ".." not in f.parts:
                files.add(base / f)
    for pkg in OWN_PACKAGES:
        files.update((ROOT / pkg).rglob("*.py"))
    return sorted(p for p in files if p.is_file())


def _compile(paths: list[Path]) -> int:
    # quiet=2: a module that does not compile on this Python (a backport's other branch)
    # is skipped, as pip and uv skip it
    return sum(not compileall.compile_file(str(p), quiet=2, force=False) for p in paths)


def main() -> int:
    files = runtime_files()
    workers = max(1, min(len(os.sched_getaffinity(0)), 8))
    chunks = [files[i::workers * 4] for i in range(workers * 4)]
    with ProcessPoolExecutor(workers) as pool:
        skipped = sum(pool.map(_compile, chunks))
    print(f"bytecode: {len(files) - skipped} modules of the runtime compiled "
          f"({skipped} that do not compile on Python {sys.version.split()[0]} skipped)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
