"""Every benchmark that finds the repository from its own path (`Path(__file__).parents[N]`)
finds the repository's root, wherever the module sits in `benchmarks/` (a module moved
one folder deeper once looked for `deployments/configs/demo.yaml` inside `benchmarks/`)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]


def test_every_parents_index_in_benchmarks_reaches_the_repository_root():
    found = []
    for path in sorted((ROOT / "benchmarks").rglob("*.py")):
        for n in re.findall(r"Path\(__file__\)\.resolve\(\)\.parents\[(\d+)\]", path.read_text()):
            found.append(path)
            reached = path.parents[int(n)]
            assert (reached / "pyproject.toml").exists(), \
                f"{path.relative_to(ROOT)}: parents[{n}] is {reached}, not the repository"
    assert found, "the pattern matches the benchmarks that use it"
