"""`batching` exports every name a model author imports: the interfaces of stateless,
stateful and generative models and what they use, so `from batching import ...` is all
a model needs (the examples in the README and the docs import nothing else of Raybatch)."""

from __future__ import annotations

import ast
import re

import batching
from tests.conftest import ROOT

MODEL_FILES = [*sorted((ROOT / "deployments" / "models").glob("*.py")),
               ROOT / "tests" / "models.py"]


def imported_from_batching(source: str) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "batching":
            names |= {alias.name for alias in node.names}
    return names


def test_every_name_the_models_import_from_batching_is_exported_by_batching():
    used = set().union(*(imported_from_batching(p.read_text()) for p in MODEL_FILES))
    pages = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    readme = "\n".join(block for page in pages
                       for block in re.findall(r"```python\n(.*?)```", page.read_text(), re.S))
    used |= imported_from_batching(readme)
    assert {"VectorTransformer", "StatefulTransformer", "SequenceBatchInput"} <= used
    assert used - set(batching.__all__) == set()
    for name in ("SequenceBatchInput", "StateStore", "StepModel", "ItemFailed", "as_batch",
                 "TensorBatch"):
        assert name in batching.__all__ and getattr(batching, name) is not None
