"""Guard: the notebooks are committed without outputs, and each is sized by one switch.

The test suite executes them (`make test` runs `pytest --nbmake notebooks`); this
checks what git holds. Outputs in git bloat every diff with images and hide the
change in review, and a notebook run by hand leaves them behind, so a committed
output fails here with the fix in the message.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
NOTEBOOKS = sorted((ROOT / "notebooks").glob("*.ipynb"))
EXPECTED = ["01_batching_basics", "02_sizing_with_the_simulator", "03_serving_on_ray",
            "04_sequences_and_generation"]


def _cells(path: Path) -> list[dict]:
    return json.loads(path.read_text())["cells"]


def test_the_four_notebooks_are_there():
    assert [p.stem for p in NOTEBOOKS] == EXPECTED


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_committed_without_outputs(path: Path):
    dirty = [i for i, c in enumerate(_cells(path)) if c["cell_type"] == "code"
             and (c.get("outputs") or c.get("execution_count") is not None
                  or "execution" in c.get("metadata", {}))]
    assert not dirty, (
        f"notebooks/{path.name}: cells {dirty} carry outputs, execution counts or timings; "
        "commit notebooks stripped: run `make notebooks-clean`"
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_sized_by_the_scale_switch_in_a_parameters_cell(path: Path):
    code = [c for c in _cells(path) if c["cell_type"] == "code"]
    first = code[0]
    assert "parameters" in first.get("metadata", {}).get("tags", []), (
        f"notebooks/{path.name}: the first code cell holds the parameters; tag it 'parameters'"
    )
    assert "notebook_scale()" in "".join(first["source"]), (
        f"notebooks/{path.name}: size the notebook with benchmarks.common.scale.notebook_scale(), "
        "so CI runs it small"
    )


@pytest.mark.parametrize("path", NOTEBOOKS, ids=lambda p: p.stem)
def test_runs_on_the_default_python_kernel(path: Path):
    kernel = json.loads(path.read_text())["metadata"]["kernelspec"]["name"]
    assert kernel == "python3", f"notebooks/{path.name} names kernel {kernel!r}: use python3"
